"""Data parallel with ``torch.nn.parallel.DistributedDataParallel`` as a model transform, with Accelerate's
communication hooks (``DistributedDataParallelKwargs.comm_hook`` / ``comm_wrapper``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from overdrive.config import DDPCommunicationHookType as Hook
from overdrive.config import DistributedDataParallelKwargs
from overdrive.runtime.group import world_size


def apply_ddp(model: nn.Module, device: torch.device, process_group: Any,
              options: DistributedDataParallelKwargs) -> DistributedDataParallel:
    """``DistributedDataParallel`` around ``model`` over ``process_group`` (None: every process), with the
    options' keyword arguments and communication hook."""
    device_ids = [device.index] if device.type != "cpu" and device.index is not None else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group,
                                      **options.ddp_kwargs())
    hook = comm_hook(options, process_group)
    if hook is not None:
        wrapped.register_comm_hook(*hook)
    return wrapped


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


def comm_hook(options: DistributedDataParallelKwargs, group: Any = None) -> tuple[Any, Callable] | None:
    """``(state, hook)`` for ``register_comm_hook`` as the options ask, or None for no hook."""
    kind, wrapper = Hook(options.comm_hook), Hook(options.comm_wrapper)
    if kind == Hook.NO:
        return None
    if kind in (Hook.FP16, Hook.BF16):
        return group, compress_hook(torch.float16 if kind == Hook.FP16 else torch.bfloat16)
    # lazy: the PowerSGD hooks' package takes longer to import than DDP itself, and only PowerSGD uses it
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    state = powerSGD_hook.PowerSGDState(process_group=group, **options.comm_state_option)
    hook = powerSGD_hook.powerSGD_hook if kind == Hook.POWER_SGD else powerSGD_hook.batched_powerSGD_hook
    if wrapper == Hook.FP16:
        hook = default_hooks.fp16_compress_wrapper(hook)
    elif wrapper == Hook.BF16:
        hook = default_hooks.bf16_compress_wrapper(hook)
    return state, hook
