"""The enums of Accelerate's configuration, and the helpers that read a value as one of them."""

from __future__ import annotations

import enum
from dataclasses import fields
from typing import Any

from overdrive.config.choices import invalid_choice


class _StrEnum(str, enum.Enum):
    """A string enum as Accelerate's (``str()`` is the value; ``list()`` the values)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """The values, as strings."""
        return [member.value for member in cls]


class DistributedType(_StrEnum):
    """How a run is parallel, as Accelerate reports it. Descriptive only: nothing dispatches on it."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(_StrEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(_StrEnum):
    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    NPU = "npu"
    MLU = "mlu"
    MUSA = "musa"
    HPU = "hpu"
    XPU = "xpu"
    GENERATOR = "generator"


class LoggerType(_StrEnum):
    ALL = "all"
    JSONL = "jsonl"
    CSV = "csv"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    TRACKIO = "trackio"
    SWANLAB = "swanlab"


class DDPCommunicationHookType(_StrEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


def enum_choice(enum_cls: type[enum.Enum], value: Any, name: str) -> Any:
    """``value`` as a member of ``enum_cls``, or an error that lists the valid values."""
    try:
        return enum_cls(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        raise ValueError(invalid_choice(f"{name}={value!r}", value, [m.value for m in enum_cls])) from None


def field_names(cls: type) -> list[str]:
    """The field names of a dataclass, in order (for messages that list the valid keys)."""
    return [f.name for f in fields(cls)]
