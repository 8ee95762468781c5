"""Data parallel with ``torch.nn.parallel.DistributedDataParallel``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from overdrive.resolve import DDPSettings
from overdrive.strategies.base import StrategyContext
from overdrive.strategies.single import SingleDeviceStrategy
from overdrive.transforms.data_parallel import apply_ddp


class DDPStrategy(SingleDeviceStrategy):
    """The single-device strategy plus DDP's wrapping and synchronisation; the rest (clipping, optimizer,
    backward) is the same, since DDP leaves identical gradients on every rank."""

    name = "ddp"
    settings_type = DDPSettings

    def __init__(self, context: StrategyContext, settings: DDPSettings) -> None:
        super().__init__(context, settings)
        self.options = settings.options
        #: the processes that replicate the model: the data-parallel axis of the mesh when there is one (a
        #: pipeline stage's peers), else all of them
        group = context.mesh.get("dp")
        self.process_group = group.get_group() if group is not None else None

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """The one-process model path, then ``DistributedDataParallel`` around the transformed model (not in
        evaluation mode, nor for a model with nothing to train: nothing to synchronise)."""
        model = super().wrap_model(model, device_placement, evaluation_mode, hooks=hooks)
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        return apply_ddp(model, self.device, self.process_group, self.options)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The module inside ``DistributedDataParallel`` (``model`` itself if it was not wrapped)."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """DDP's ``no_sync()``: gradients accumulate locally until the window's last backward."""
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Make the next backward all-reduce gradients even inside ``no_sync`` (restored on exit), as Accelerate:
        always, since the forwards may have run inside ``no_sync`` although the model syncs again by now."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        # DDP decides in forward whether the next backward reduces; ask it to, for this backward only.
        previous = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = previous
