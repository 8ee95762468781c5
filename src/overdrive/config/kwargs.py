"""The ``*Kwargs`` handlers: arguments passed through to one PyTorch call each, and gradient accumulation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from overdrive.config.enums import DDPCommunicationHookType, enum_choice


class KwargsHandler:
    """Base of the ``*Kwargs`` dataclasses: ``to_kwargs()`` gives the fields that differ from defaults."""

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the fields, by name."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from the defaults (what is passed on to PyTorch)."""
        default = self.__class__().to_dict()
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
        self.comm_hook = enum_choice(DDPCommunicationHookType, self.comm_hook, "comm_hook")
        self.comm_wrapper = enum_choice(DDPCommunicationHookType, self.comm_wrapper, "comm_wrapper")

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
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation: sync and step every ``num_steps`` batches (and at the end of the loader).

    ``exact_last_window`` (overdrive's, off by default): the loss of a window cut short by the end of the data
    is divided by that window's real length, so its step equals one step on the mean over its batches.
    Off, as in Accelerate, every loss is divided by ``num_steps`` (a short last window takes a smaller step).
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    exact_last_window: bool = False


