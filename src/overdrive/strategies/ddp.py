"""Data parallel with ``torch.nn.parallel.DistributedDataParallel``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from overdrive.config import DDPCommunicationHookType as Hook
from overdrive.config import DistributedDataParallelKwargs
from overdrive.resolve import DDPSettings
from overdrive.runtime.group import world_size
from overdrive.strategies.base import StrategyContext
from overdrive.strategies.single import SingleDeviceStrategy
from overdrive.transforms.path import ModelPath, PathStep


class DDPStrategy(SingleDeviceStrategy):
    """The single-device strategy plus DDP's wrapping (the model path's ``data_parallel`` step) and
    synchronisation; the rest (clipping, optimizer, backward) is the same, since DDP leaves identical
    gradients on every rank."""

    name = "ddp"
    settings_type = DDPSettings

    def __init__(self, context: StrategyContext, settings: DDPSettings) -> None:
        super().__init__(context, settings)
        self.options = settings.options
        #: the processes that replicate the model: the data-parallel axis of the mesh when there is one (a
        #: pipeline stage's peers), else all of them
        group = context.mesh.get("dp")
        self.process_group = group.get_group() if group is not None else None

    def path_overrides(self) -> Mapping[str, PathStep]:
        """``data_parallel``: ``DistributedDataParallel`` around the transformed model."""
        return {"data_parallel": self.data_parallel}

    def data_parallel(self, path: ModelPath, model: nn.Module) -> nn.Module:
        """The model path's last step: ``DistributedDataParallel`` around the transformed model (not in
        evaluation mode, nor for a model with nothing to train)."""
        if path.evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. a frozen model used for evaluation)
        device_ids = [self.device.index] if self.device.type != "cpu" and self.device.index is not None else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=self.process_group,
                                          **self.options.ddp_kwargs())
        hook = _comm_hook(self.options, self.process_group)
        if hook is not None:
            wrapped.register_comm_hook(*hook)
        return wrapped

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


def compress_hook(dtype: torch.dtype) -> Callable:
    """All-reduce each gradient bucket in ``dtype`` (works on gloo, unlike torch's bf16 hook)."""

    # No annotations: DDP checks them against real classes, and this module's are postponed strings.
    def hook(group, bucket):
        group = group if group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(world_size(group))
        work = dist.all_reduce(compressed, group=group, async_op=True)
        assert work is not None  # async_op=True always returns the Work (torch types it Work | None)
        future = work.get_future()

        def decompress(fut: torch.futures.Future) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return future.then(decompress)

    return hook


def _comm_hook(options: DistributedDataParallelKwargs, group: Any = None) -> tuple[Any, Callable] | None:
    kind, wrapper = Hook(options.comm_hook), Hook(options.comm_wrapper)
    if kind == Hook.NO:
        return None
    if kind in (Hook.FP16, Hook.BF16):
        return group, compress_hook(torch.float16 if kind == Hook.FP16 else torch.bfloat16)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # PowerSGD only

    state = powerSGD_hook.PowerSGDState(process_group=group, **options.comm_state_option)
    hook = powerSGD_hook.powerSGD_hook if kind == Hook.POWER_SGD else powerSGD_hook.batched_powerSGD_hook
    if wrapper == Hook.FP16:
        hook = default_hooks.fp16_compress_wrapper(hook)
    elif wrapper == Hook.BF16:
        hook = default_hooks.bf16_compress_wrapper(hook)
    return state, hook
