"""Operations on nested structures of tensors (dicts, lists, tuples, namedtuples): moving, converting,
and the collectives (gather, reduce, broadcast, pad) across processes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch


def is_torch_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a sequence of ``obj``'s type (namedtuples included) from ``generator``."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def recursively_apply(func: Callable, data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """Apply ``func`` to every leaf of ``data`` that passes ``test_type``, keeping the structure."""
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, o, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs)
                                 for o in data))
    if isinstance(data, Mapping):
        return type(data)({k: recursively_apply(func, v, *args, test_type=test_type,
                                                error_on_other_type=error_on_other_type, **kwargs)
                           for k, v in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(f"cannot apply {getattr(func, '__name__', func)} to {type(data).__name__}: only nested "
                        "lists, tuples and dicts of tensors are supported")
    return data


def send_to_device(data: Any, device: torch.device | str | int, non_blocking: bool = False,
                   skip_keys: list[str] | str | None = None) -> Any:
    """Move every tensor (and every object with a ``to`` method) in ``data`` to ``device``."""
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(data, (tuple, list)):
        return honor_type(data, (send_to_device(t, device, non_blocking, skip_keys) for t in data))
    if isinstance(data, Mapping):
        skip = skip_keys or []
        return type(data)({k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                           for k, v in data.items()})
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if hasattr(data, "to") and callable(data.to):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:
            return data.to(device)
    return data


def convert_to_fp32(data: Any) -> Any:
    """Every fp16/bf16 tensor in ``data`` as fp32; everything else unchanged."""
    return recursively_apply(lambda t: t.float(), data,
                             test_type=lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.float16,
                                                                                             torch.bfloat16))
