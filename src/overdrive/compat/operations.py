"""The ``accelerate.utils.operations`` names that ``overdrive.helpers.ops`` does not define itself."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

import overdrive.helpers.ops as ops
from overdrive.helpers.ops import CannotPadNestedTensorWarning  # noqa: F401 (Accelerate's name, in accelerate.utils)


def GatheredParameters(params: Any, modifier_rank: int | None = None, fwd_module: Any = None,  # noqa: N802
                       enabled: bool = True) -> contextlib.AbstractContextManager:
    """DeepSpeed ZeRO-3's ``GatheredParameters`` when DeepSpeed is installed and a ZeRO-3 run is on;
    a no-op block otherwise (the parameters are whole already)."""
    from overdrive.helpers.imports import is_deepspeed_available

    if enabled and is_deepspeed_available():
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, fwd_module=fwd_module,
                                                 enabled=enabled)
    return contextlib.nullcontext()


def convert_outputs_to_fp32(model_forward: Callable) -> Callable:
    """Decorator: the function's float16/bfloat16 tensor outputs come back as float32."""
    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return ops.convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad the batch dim of every tensor so that ``batch_size`` divides evenly among ``num_processes``
    (repeating the last row); the smallest multiple of ``num_processes`` not below ``batch_size``."""
    remainder = batch_size % num_processes
    if remainder == 0:
        return tensor
    missing = num_processes - remainder

    def pad(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= dim or t.shape[dim] != batch_size:
            return t
        last = t.narrow(dim, batch_size - 1, 1)
        return torch.cat([t, last.expand(*[missing if d == dim else s for d, s in enumerate(last.shape)])], dim=dim)

    return ops.recursively_apply(pad, tensor)
