"""The enums of Accelerate's configuration, and the helpers that read a value as one of them."""

from __future__ import annotations

import enum
from dataclasses import fields
from typing import Any

from overdrive.config.choices import invalid_choice

# Each enum has the bases of Accelerate's enum of the same name, so that it prints (str, repr, format),
# compares (==, `in`) and hashes as Accelerate's does: scripts compare and log these values.


class EnumWithContains(enum.EnumMeta):
    """The metaclass of Accelerate's ``BaseEnum``: ``value in SomeEnum`` is true for a member's value."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """Accelerate's base enum: ``str(member)`` is its value, ``list()`` the values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """The values, as strings."""
        return list(map(str, cls))


class DistributedType(str, enum.Enum):
    """How a run is parallel, as Accelerate reports it. Descriptive only: nothing dispatches on it."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class PrecisionType(str, BaseEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(BaseEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class LoggerType(BaseEnum):
    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    # overdrive's own trackers (after Accelerate's members, which keep Accelerate's order)
    JSONL = "jsonl"
    CSV = "csv"


class DDPCommunicationHookType(BaseEnum):
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
