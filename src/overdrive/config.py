"""User-facing configuration: plugins, kwargs handlers and enums, with Accelerate's names and fields.

These are plain values. They never read the environment and never act; ``overdrive.resolve`` turns
them, the launch config and the environment into one frozen plan.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return self.value


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
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(_StrEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


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


class DDPCommunicationHookType(_StrEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class KwargsHandler:
    """Base of the ``*Kwargs`` dataclasses: ``to_kwargs()`` gives the fields that differ from defaults."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__().to_dict()  # type: ignore[call-arg]
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel``, and its communication hook."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: Literal[DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16,
                          DDPCommunicationHookType.BF16] | str = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = _choice(DDPCommunicationHookType, self.comm_hook, "comm_hook")
        self.comm_wrapper = _choice(DDPCommunicationHookType, self.comm_wrapper, "comm_wrapper")

    def ddp_kwargs(self) -> dict[str, Any]:
        """The fields that ``DistributedDataParallel`` itself takes."""
        skip = {"comm_hook", "comm_wrapper", "comm_state_option"}
        return {k: v for k, v in self.to_kwargs().items() if k not in skip}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for ``torch.amp.GradScaler`` (fp16 loss scaling)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``. ``backend=None`` picks the device's own."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``torch.autocast`` around the prepared models' forward."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for ``torch.profiler.profile`` used by ``Accelerator.profile``."""

    activities: list[Literal["cpu", "xpu", "mtia", "cuda", "hpu"]] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None


@dataclass
class DataLoaderConfiguration:
    """How prepared data loaders shard, order and move batches.

    - ``split_batches``: the loader's batch is the global batch and is split across processes
      (its size must divide by the number of processes); otherwise each process gets a whole batch.
    - ``dispatch_batches``: rank 0 reads every batch and sends each process its part (default: on for
      iterable datasets).
    - ``even_batches``: every process gets the same number of batches, wrapping around to the start of
      the data to fill the last one; ``gather_for_metrics`` drops those duplicates.
    - ``use_seedable_sampler``: shuffle from ``data_seed`` (default: the seed in force) and the epoch, so
      the global order is the same at any world size.
    - ``non_blocking``: copy batches to the device asynchronously (with pinned memory).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation: sync and step every ``num_steps`` batches (and at the end of the loader)."""

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclass
class ProjectConfiguration:
    """Where a run writes its checkpoints and logs, and how checkpoints are named and kept."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


def _choice(enum_cls: type[enum.Enum], value: Any, name: str) -> Any:
    """``value`` as a member of ``enum_cls``, or an error that lists the valid values."""
    try:
        return enum_cls(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"{name}={value!r} is not valid; choose one of {valid}") from None


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
