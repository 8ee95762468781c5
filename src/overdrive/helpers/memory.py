"""Freeing accelerator memory and retrying a function with smaller batches after out-of-memory errors."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

from overdrive.helpers.imports import get_torch_accelerator_backend

# RuntimeError messages that mean "this batch does not fit" (cuDNN reports some OOMs this way).
_OOM_MESSAGES = (
    "out of memory",
    "CUDNN_STATUS_NOT_SUPPORTED",
    "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
)


def normalize_device(device: Any) -> Any:
    """A device index as the device it means on this machine's accelerator (``0`` -> ``"xpu:0"``; CUDA and
    CPU indices, strings and ``torch.device`` objects unchanged; ``"npu"`` -> ``"npu:0"``, which NPUs need)."""
    if device == "npu":
        return "npu:0"
    if isinstance(device, int):
        # no availability probe: this runs under torch.compile, which a device query would break
        device_type, _ = get_torch_accelerator_backend(check_available=False)
        if device_type == "hpu":
            return "hpu"
        if device_type not in (None, "cuda"):
            return f"{device_type}:{device}"
    return device


def get_accelerator_free_memory(device_module: Any, device_index: int) -> int:
    """Free bytes on device ``device_index`` of ``device_module`` (what ``get_torch_accelerator_backend``
    returned: ``torch.cuda``, ``torch.xpu``, ... or ``torch.accelerator``)."""
    if device_module is torch.accelerator:
        memory_info = getattr(torch.accelerator, "get_memory_info", None)  # torch >= 2.10
        if memory_info is not None:
            return int(memory_info(device_index)[0])
        device_module = torch.get_device_module(torch.accelerator.current_accelerator())
    return int(device_module.mem_get_info(device_index)[0])


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return the accelerator's cached, unused memory to the device (after a ``gc.collect()`` if asked)."""
    if garbage_collection:
        gc.collect()
    if not torch.accelerator.is_available():
        return
    empty_cache = getattr(torch.accelerator, "empty_cache", None)  # torch >= 2.8
    if empty_cache is None:
        accelerator = torch.accelerator.current_accelerator()
        module = getattr(torch, accelerator.type, None) if accelerator is not None else None
        empty_cache = getattr(module, "empty_cache", None)
    if empty_cache is not None:
        empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references to ``objects`` and free cached memory; assign the result back to the same names.

    >>> model, optimizer = release_memory(model, optimizer)
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` says the batch did not fit in memory."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return (isinstance(exception, RuntimeError) and len(exception.args) == 1
            and isinstance(exception.args[0], str) and any(m in exception.args[0] for m in _OOM_MESSAGES))


def _call_reducer(reduce_batch_size_fn: Callable[..., int], batch_size: int) -> int:
    """Accept both reducer forms: ``fn(batch_size) -> int`` and Accelerate's ``fn() -> int``."""
    try:
        takes_argument = bool(inspect.signature(reduce_batch_size_fn).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        takes_argument = True
    return int(reduce_batch_size_fn(batch_size) if takes_argument else reduce_batch_size_fn())


def find_executable_batch_size(function: Callable[..., Any] | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[..., int] | None = None) -> Callable[..., Any]:
    """Decorate ``function(batch_size, *args, **kwargs)`` so that it is called with ``starting_batch_size``
    and, after each out-of-memory error, with a smaller one (x0.9, rounded down, as Accelerate; or what
    ``reduce_batch_size_fn`` returns) until it runs. Call the result without the batch size: the decorator fills it in. The size
    that worked is kept for the next call.

    >>> @find_executable_batch_size(starting_batch_size=64)
    ... def train(batch_size, model):
    ...     ...
    >>> train(model)
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    batch_size = starting_batch_size
    parameters = list(inspect.signature(function).parameters.values())
    takes_var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = positional[0].name if positional else "batch_size"

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        if first in kwargs or (not takes_var_args and len(args) + 1 > len(positional)):
            shown = ", ".join([f"{p.name}={a!r}" for p, a in zip(positional[1:], args[1:])]
                              + [f"{k}={v!r}" for k, v in kwargs.items() if k != first])
            raise TypeError(
                f"{function.__name__}() was called with its batch size: the first argument, `{first}`, is "
                f"filled in by @find_executable_batch_size. Call it without it: "
                f"`{function.__name__}({shown})`")
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size <= 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # anything but an out-of-memory error is re-raised
                if not should_reduce_batch_size(error):
                    raise
            # Outside the except block, so the error's traceback (and the tensors its frames hold) is gone.
            clear_device_cache(garbage_collection=True)
            batch_size = (int(batch_size * 0.9) if reduce_batch_size_fn is None  # x0.9, as Accelerate
                          else _call_reducer(reduce_batch_size_fn, batch_size))

    return decorator
