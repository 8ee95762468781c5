"""The ``accelerate.utils.operations`` names that ``overdrive.helpers.ops`` does not define itself."""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable
from typing import Any

import torch

import overdrive.helpers.ops as ops
from overdrive.helpers.imports import is_deepspeed_available
from overdrive.helpers.ops import CannotPadNestedTensorWarning  # noqa: F401 (Accelerate's name, in accelerate.utils)
from overdrive.training.state import PartialState


def GatheredParameters(params: Any, modifier_rank: int | None = None, fwd_module: Any = None,  # noqa: N802
                       enabled: bool = True) -> contextlib.AbstractContextManager:
    """DeepSpeed ZeRO-3's ``GatheredParameters`` when DeepSpeed is installed and a ZeRO-3 run is on;
    a no-op block otherwise (the parameters are whole already)."""
    if enabled and is_deepspeed_available():
        import deepspeed  # lazy: optional dependency

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


class ConvertOutputsToFp32:
    """Wraps a forward function so that its float16/bfloat16 tensor outputs come back as float32 (the class
    behind ``convert_outputs_to_fp32``); refuses pickling, as Accelerate's does."""

    def __init__(self, model_forward: Callable) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return ops.convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError("Cannot pickle a prepared model with automatic mixed precision: unwrap it with "
                                   "accelerator.unwrap_model(model) before pickling it")


#: the dtype codes gather_tensor_shape sends between processes
TENSOR_TYPE_TO_INT = {torch.float: 1, torch.double: 2, torch.half: 3, torch.bfloat16: 4, torch.uint8: 5,
                      torch.int8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9, torch.bool: 10}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}
_MAX_SHAPE_LENGTH = 2**20


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The shape of a tensor that exists on one process only (``None`` elsewhere), on every process: a tensor
    of its sizes and its dtype code (``TENSOR_INT_TO_DTYPE``). A collective: every process calls it."""
    device = PartialState().device
    header = torch.zeros(_MAX_SHAPE_LENGTH, dtype=torch.int, device=device)
    if tensor is not None:
        known = [tensor.ndim, TENSOR_TYPE_TO_INT[tensor.dtype], *tensor.shape]
        header[: len(known)] = torch.tensor(known, dtype=torch.int, device=device)
    header = ops.reduce(header, reduction="sum")  # only the holder contributes
    ndim, dtype = header[:2].tolist()
    return header[2: ndim + 2], dtype


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` lives on an Intel XPU."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def verify_operation(function: Callable) -> Callable:
    """Decorator for a collective over nested tensors: in a debug run (``ACCELERATE_DEBUG_MODE``) with several
    processes, first check that the tensors are on the run's device and have the same shapes on every process,
    raising ``DistributedOperationException`` with each process's shapes instead of hanging."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = PartialState()
        if state.num_processes == 1 or not state.debug:
            return function(*args, **kwargs)
        operation = f"{function.__module__}.{function.__name__}"
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        found = ops.find_device(tensor)
        if found is not None and state.device.type != found.type:
            raise ops.DistributedOperationException(
                f"One or more of the tensors passed to {operation} are not on {state.device.type}, the device of "
                f"this run: move them there before calling {operation}")
        shapes = ops.gather_object([ops.get_shape(tensor)])
        if shapes[0] is not None and shapes.count(shapes[0]) != len(shapes):
            listed = "\n  - ".join(f"Process {i}: {shape}" for i, shape in enumerate(shapes))
            raise ops.DistributedOperationException(
                f"Cannot apply {operation}: the shapes differ between processes and must match.\n"
                f"Operation: `{operation}`\nInput shapes:\n  - {listed}")
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable) -> Callable:
    """Decorator: a ``DistributedOperationException`` raised inside ``function`` is raised again naming it."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ops.DistributedOperationException as error:
            operation = f"{function.__module__}.{function.__name__}"
            raise ops.DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more details.") from error

    return wrapper
