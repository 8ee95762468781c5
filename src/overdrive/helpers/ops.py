"""Operations on nested structures of tensors (dicts, lists, tuples, namedtuples): moving, converting,
and the collectives (gather, reduce, broadcast, pad) across processes."""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from overdrive.runtime.group import is_distributed, world_size


def wait_for_everyone() -> None:
    """Barrier across every process (a no-op in a single process)."""
    if is_distributed():
        dist.barrier()


def is_torch_tensor(value: Any) -> bool:
    """Whether ``tensor`` is a ``torch.Tensor``."""
    return isinstance(value, torch.Tensor)


def honor_type(obj: Any, generator: Any) -> Any:
    """Build a sequence of ``obj``'s type (namedtuples included) from ``generator``."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def honor_mapping(obj: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of ``obj``'s type (``dict``, ``OrderedDict``, ``BatchEncoding``...) holding ``items``."""
    # the abstract Mapping declares no constructor; every concrete mapping met here takes a dict
    return cast("Callable[[dict[Any, Any]], Any]", type(obj))(items)


def recursively_apply(func: Callable, data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """Apply ``func`` to every leaf of ``data`` that passes ``test_type``, keeping the structure."""
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, o, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs)
                                 for o in data))
    if isinstance(data, Mapping):
        return honor_mapping(data, {k: recursively_apply(func, v, *args, test_type=test_type,
                                                         error_on_other_type=error_on_other_type, **kwargs)
                                    for k, v in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        # Accelerate's wording (its test suite compares it)
        raise TypeError(f"Unsupported types ({type(data)}) passed to `{getattr(func, '__name__', func)}`. Only "
                        "nested list/tuple/dicts of objects that are valid for "
                        f"`{getattr(test_type, '__name__', test_type)}` should be passed.")
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
        return honor_mapping(data, {k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
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


# ---------------------------------------------------------------------------------------------------------
# Inspecting and reshaping nested structures
# ---------------------------------------------------------------------------------------------------------


class DistributedOperationException(RuntimeError):
    """A collective was called with inputs that do not agree across processes (shapes, dtypes)."""


@dataclass(frozen=True)
class TensorInformation:
    """The shape and dtype of a tensor, enough to allocate a matching empty one."""

    shape: torch.Size
    dtype: torch.dtype


def is_namedtuple(data: Any) -> bool:
    """Whether ``data`` is an instance of a ``collections.namedtuple`` / ``typing.NamedTuple`` class."""
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def is_tensor_information(data: Any) -> bool:
    """Whether ``data`` is a ``TensorInformation`` (the shape and dtype standing for a tensor)."""
    return isinstance(data, TensorInformation)


def _iter_tensors(data: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf of ``data``, depth first, in the order ``recursively_apply`` visits them."""
    if isinstance(data, (tuple, list)):
        for item in data:
            yield from _iter_tensors(item)
    elif isinstance(data, Mapping):
        for item in data.values():
            yield from _iter_tensors(item)
    elif isinstance(data, torch.Tensor):
        yield data


def get_data_structure(data: Any) -> Any:
    """``data`` with every tensor replaced by its :class:`TensorInformation`."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with every tensor replaced by its shape as a list of ints."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Allocate an empty tensor for every :class:`TensorInformation` in ``data_structure``."""
    return recursively_apply(lambda info: torch.empty(info.shape, dtype=info.dtype), data_structure,
                             test_type=is_tensor_information)


def find_batch_size(data: Any) -> int:
    """The size of dim 0 of the first tensor (with at least one dim) found in ``data``.

    >>> find_batch_size({"x": torch.zeros(8, 3), "y": [torch.zeros(8)]})
    8
    """
    if isinstance(data, (tuple, list, Mapping)) and len(data) == 0:
        raise ValueError(f"cannot find the batch size of an empty {type(data).__name__}")
    for tensor in _iter_tensors(data):
        if tensor.ndim > 0:
            return tensor.shape[0]
    raise TypeError(f"cannot find the batch size of {type(data).__name__}: it holds no tensor with a dim 0 "
                    "(expected a tensor or nested lists, tuples and dicts of tensors)")


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or ``None`` where it cannot tell."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in ``data``, or ``None`` when it holds none."""
    return next((tensor.device for tensor in _iter_tensors(data)), None)


def _to_list(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32, torch.float64):
        tensor = tensor.float()  # bf16 / fp8 have no Python conversion
    return tensor.tolist()


def listify(data: Any) -> Any:
    """``data`` with every tensor turned into (nested) Python lists or numbers."""
    return recursively_apply(_to_list, data)


def slice_tensors(data: Any, tensor_slice: slice | int | torch.Tensor, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """Index every tensor in ``data`` with ``tensor_slice``.

    ``process_index`` and ``num_processes`` are accepted for Accelerate compatibility and unused.
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-shaped nested structures leaf by leaf along ``dim``; a list of one
    non-tensor is returned as that one item.

    >>> concatenate([{"x": torch.zeros(2)}, {"x": torch.ones(3)}])["x"].shape
    torch.Size([5])
    """
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise TypeError(f"concatenate expects a non-empty list of nested structures, got {data!r:.80}")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return honor_mapping(first, {k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if not isinstance(first, torch.Tensor):
        if len(data) == 1:  # a single batch of anything comes back as it is (as in Accelerate)
            return first
        raise TypeError(f"can only concatenate tensors (or nested lists, tuples and dicts of them), "
                        f"got {type(first).__name__}")
    return torch.cat(list(data), dim=dim)


# ---------------------------------------------------------------------------------------------------------
# Collectives. Each is the identity (or the obvious one-process answer) without a group of 2+ processes.
# ---------------------------------------------------------------------------------------------------------

# dtypes every backend moves as they are; anything else travels as raw bytes (gloo refuses int16, uint16+,
# float8; NCCL refuses some too), which is lossless for gather and broadcast.
_WIRE_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                          torch.float32, torch.float64})
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(
    sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))}
_META_DIMS = 8  # shape columns in gather's size exchange; dims past the 8th are folded into the last column
_REDUCTIONS = ("mean", "sum", "max", "none")


def _tensor_leaves(data: Any, op_name: str) -> list[torch.Tensor]:
    """Every tensor leaf of ``data``; a TypeError naming ``op_name`` for any other leaf."""
    leaves: list[torch.Tensor] = []

    def take(tensor: torch.Tensor) -> torch.Tensor:
        leaves.append(tensor)
        return tensor

    take.__name__ = op_name
    recursively_apply(take, data, error_on_other_type=True)
    return leaves


def _rebuild(data: Any, values: list[Any]) -> Any:
    """``data`` with its tensor leaves replaced, in visiting order, by ``values``."""
    it = iter(values)
    return recursively_apply(lambda _: next(it), data)


def _as_wire(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of a dtype every backend can move; raw bytes for the others (a view if possible)."""
    tensor = tensor.contiguous()
    if tensor.dtype in _WIRE_DTYPES:
        return tensor
    return tensor.reshape(-1).view(torch.uint8) if tensor.ndim == 0 else tensor.view(torch.uint8)


def _shape_row(tensor: torch.Tensor) -> list[int]:
    shape = list(tensor.shape)
    if len(shape) > _META_DIMS:
        shape = shape[:_META_DIMS - 1] + [math.prod(shape[_META_DIMS - 1:])]
    return [tensor.ndim, _DTYPE_CODES.get(tensor.dtype, -1)] + shape + [-1] * (_META_DIMS - len(shape))


def _exchange_shapes(leaves: list[torch.Tensor], world: int) -> torch.Tensor:
    """One all_gather of every leaf's (ndim, dtype, shape) row; returns a CPU tensor [world, leaves, row]."""
    local = torch.tensor([_shape_row(t) for t in leaves], dtype=torch.int64, device=leaves[0].device)
    out = local.new_empty((world * local.shape[0], local.shape[1]))
    dist.all_gather_single(out, local)
    return out.view(world, len(leaves), -1).cpu()


# -- structure pre-flight ---------------------------------------------------------------------------------
# Collectives over nested structures are one backend call per leaf: if the ranks' structures differ (other
# keys, another leaf count, other shapes) the calls pair up wrongly, and gloo then aborts the process, hangs,
# or files one rank's data under another's key. So each rank first shares a fingerprint of its structure;
# where they differ, every rank raises the same error with every rank's description. gather's fingerprint
# travels in the size exchange it needs anyway (no extra collective for up to _PREFLIGHT_LEAVES leaves).
_PREFLIGHT_LEAVES = 16


def _leaf_text(tensor: torch.Tensor, shapes: str) -> str:
    if shapes == "all":
        shape: tuple = tuple(tensor.shape)
    elif shapes == "tail":  # every dim but the first
        shape = ("*", *tensor.shape[1:])  # a 0-d tensor gathers as one element, like a 1-d one
    else:  # "ndim": the number of dims only
        shape = ("*",) * tensor.ndim
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(shape)}".replace("'", "")


def describe_structure(data: Any, shapes: str = "all") -> str:
    """A short text of ``data``'s structure: containers, keys, and each tensor's dtype and shape
    (``shapes``: ``"all"`` dims, ``"tail"``: all but the first, ``"ndim"``: their number only).

    >>> describe_structure({"x": torch.zeros(2, 3), "y": [torch.zeros(2, dtype=torch.int64)]})
    "{'x': float32[2, 3], 'y': [int64[2]]}"
    """
    if isinstance(data, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe_structure(v, shapes)}" for k, v in data.items()) + "}"
    if isinstance(data, (tuple, list)):
        inner = ", ".join(describe_structure(v, shapes) for v in data)
        return f"({inner})" if isinstance(data, tuple) else f"[{inner}]"
    if isinstance(data, torch.Tensor):
        return _leaf_text(data, shapes)
    return type(data).__name__


def _fingerprint(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _structure_error(op_name: str, data: Any, why: str) -> DistributedOperationException:
    """The error every rank raises when the structures differ (one more collective: the descriptions)."""
    described: list[Any] = [None] * world_size()
    dist.all_gather_object(described, describe_structure(data))
    per_rank = "; ".join(f"rank {r}: {d}" for r, d in enumerate(described))
    return DistributedOperationException(
        f"{op_name}: the input does not have the same structure on every process ({why}): {per_rank}. Every process "
        "must pass the same keys, the same number of tensors and matching dtypes and shapes")


def _preflight(op_name: str, data: Any, leaves: list[torch.Tensor], shapes: str) -> None:
    """Raise on every rank unless every rank's structure (with ``shapes`` as in ``describe_structure``)
    is the same."""
    device = leaves[0].device if leaves else torch.device("cpu")
    local = torch.tensor([_fingerprint(describe_structure(data, shapes))], dtype=torch.int64, device=device)
    out = local.new_empty(world_size())
    dist.all_gather_single(out, local)
    if bool((out == out[0]).all()):
        return
    raise _structure_error(op_name, data, "shapes" if shapes == "all" else "keys, tensors or dtypes")


def _gather_meta(data: Any, leaves: list[torch.Tensor], world: int) -> torch.Tensor:
    """gather's one size exchange, which also carries the structure's fingerprint: [world, leaves, row]."""
    width = 2 + _META_DIMS
    header = [_fingerprint(describe_structure(data, "tail")), len(leaves)] + [0] * (width - 2)
    rows = [header] + [_shape_row(t) for t in leaves[:_PREFLIGHT_LEAVES]]
    rows += [[0] * width] * (1 + _PREFLIGHT_LEAVES - len(rows))
    local = torch.tensor(rows, dtype=torch.int64, device=leaves[0].device)
    out = local.new_empty((world * local.shape[0], width))
    dist.all_gather_single(out, local)
    table = out.view(world, 1 + _PREFLIGHT_LEAVES, width).cpu()
    if not bool((table[:, 0, :2] == table[0, 0, :2]).all()):
        raise _structure_error("gather", data, "keys, tensors, dtypes or dims after the first")
    meta = table[:, 1:1 + len(leaves)]
    if len(leaves) > _PREFLIGHT_LEAVES:  # the same count everywhere (checked above): the rest in one more call
        meta = torch.cat([meta, _exchange_shapes(leaves[_PREFLIGHT_LEAVES:], world)], dim=1)
    return meta


def _gather_one(tensor: torch.Tensor, sizes: list[int], world: int) -> torch.Tensor:
    # Collectives are not differentiable: work on the values, so that a tensor with autograd history (a loss
    # or logits computed with grad on) gathers in any grad mode and its own graph is left alone.
    tensor = tensor.detach()
    rest, longest = tensor.shape[1:], max(sizes)
    if longest == 0 or rest.numel() == 0:
        return tensor.new_empty((sum(sizes), *rest))
    if tensor.shape[0] < longest:  # uneven dim 0: pad to the longest, gather, trim each rank's padding
        tensor = torch.cat([tensor, tensor.new_zeros((longest - tensor.shape[0], *rest))])
    wire = _as_wire(tensor)
    out = wire.new_empty((world * wire.shape[0], *wire.shape[1:]))
    dist.all_gather_single(out, wire)
    if out.dtype != tensor.dtype:
        out = out.view(tensor.dtype)
    if len(set(sizes)) == 1:
        return out
    out = out.view(world, longest, *rest)
    return torch.cat([out[rank, :size] for rank, size in enumerate(sizes)])


def gather(tensor: Any) -> Any:
    """Concatenate every process's tensors along dim 0, in rank order, for each leaf of ``tensor``.

    0-dim tensors give one element per process. Dim 0 may differ across processes; every other dim and
    the dtype must agree.

    >>> gather(torch.tensor([rank]))  # on 3 processes
    tensor([0, 1, 2])
    """
    world = world_size()
    if world == 1:
        return tensor
    leaves = [t.reshape(1) if t.ndim == 0 else t for t in _tensor_leaves(tensor, "gather")]
    if not leaves:
        return tensor
    meta = _gather_meta(tensor, leaves, world)
    sizes = meta[:, :, 2].tolist()
    return _rebuild(tensor, [_gather_one(t, [row[i] for row in sizes], world) for i, t in enumerate(leaves)])


def gather_object(object: Any) -> list[Any]:
    """Every process's ``object`` in one flat list, in rank order; a list contributes its items.

    >>> gather_object([f"rank {rank}"])  # on 2 processes
    ['rank 0', 'rank 1']
    """
    local = object if isinstance(object, list) else [object]
    world = world_size()
    if world == 1:
        return local
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return [item for part in gathered for item in part]


def _broadcast_one(tensor: torch.Tensor, src: int) -> torch.Tensor:
    if tensor.numel() == 0:
        return tensor
    buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
    dist.broadcast(_as_wire(buffer), src=src)  # the wire form is a view of ``buffer``
    if buffer is not tensor:
        tensor.copy_(buffer)
    return tensor


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Overwrite every tensor in ``tensor``, in place, with process ``from_process``'s; returns it."""
    if world_size() == 1:
        return tensor
    _preflight("broadcast", tensor, _tensor_leaves(tensor, "broadcast"), "all")
    return recursively_apply(_broadcast_one, tensor, from_process, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Overwrite ``object_list``'s items, in place, with process ``from_process``'s (picklable objects)."""
    if world_size() > 1:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def _reduce_one(tensor: torch.Tensor, reduction: str, scale: float, world: int) -> torch.Tensor:
    exact = tensor.is_floating_point() or tensor.is_complex()
    # Sum in a dtype that neither overflows (int8/uint8) nor is refused by the backend (int16, fp8).
    if tensor.dtype in _WIRE_DTYPES and exact or tensor.dtype in (torch.complex64, torch.complex128):
        wide = tensor.dtype
    else:
        wide = torch.complex64 if tensor.is_complex() else torch.float32 if exact else torch.int64
    work = tensor.detach().to(wide, copy=True)  # values only, as in _gather_one
    if reduction != "none" and world > 1:
        dist.all_reduce(work, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
    if reduction == "mean":
        if not exact:
            work = work.to(torch.get_default_dtype())
        if world > 1:
            work.div_(world)
    if scale != 1.0:
        work = work * scale
    if exact or (reduction != "mean" and not work.is_floating_point()):
        work = work.to(tensor.dtype)
    return work


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce every tensor in ``tensor`` across processes, then multiply by ``scale``; returns new tensors.

    ``reduction``: ``"sum"``, ``"mean"`` (the sum over the number of processes; integer and bool tensors
    give floats), ``"max"`` (the element-wise largest) or ``"none"`` (no communication, each process keeps
    its own values).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not supported; use one of "
                         + ", ".join(repr(r) for r in _REDUCTIONS))
    world = world_size()
    if world > 1 and reduction != "none":
        _preflight("reduce", tensor, _tensor_leaves(tensor, "reduce"), "all")
    return recursively_apply(_reduce_one, tensor, reduction, scale, world, error_on_other_type=True)


def _pad_one(tensor: torch.Tensor, dim: int | None, size: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    if dim is None or tensor.shape[dim] >= size:
        return tensor
    shape = list(tensor.shape)
    old, shape[dim] = shape[dim], size
    padded = tensor.new_full(shape, pad_index)
    where = slice(size - old, size) if pad_first else slice(0, old)
    padded[(slice(None),) * dim + (where,)] = tensor
    return padded


class CannotPadNestedTensorWarning(UserWarning):
    """Raised as a warning when ``pad_across_processes`` meets a nested tensor it cannot pad."""


def _warn_about_nested_tensors(data: Any) -> None:
    """Warn (``CannotPadNestedTensorWarning``, as Accelerate) about each nested tensor in ``data``: padding
    leaves it as it is, since its rows have no one size to pad to."""
    def warn(tensor: torch.Tensor) -> torch.Tensor:
        warnings.warn("Cannot pad nested tensors without more information. Leaving unprocessed.",
                      CannotPadNestedTensorWarning, stacklevel=4)
        return tensor

    recursively_apply(warn, data, test_type=lambda t: isinstance(t, torch.Tensor) and t.is_nested)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
    """Pad every tensor in ``tensor`` along ``dim`` to the largest size any process has, so they can be
    gathered. Pads with ``pad_index``, at the end (or at the start with ``pad_first``). Tensors with no
    dim ``dim`` are left alone.
    """
    _warn_about_nested_tensors(tensor)
    world = world_size()
    if world == 1:
        return tensor
    leaves = _tensor_leaves(tensor, "pad_across_processes")
    if not leaves:
        return tensor
    _preflight("pad_across_processes", tensor, leaves, "ndim")
    dims = [dim % t.ndim if -t.ndim <= dim < t.ndim and not t.is_nested else None for t in leaves]
    local = torch.tensor([-1 if d is None else t.shape[d] for t, d in zip(leaves, dims)], dtype=torch.int64,
                         device=leaves[0].device)
    sizes = local.new_empty(world * len(leaves))
    dist.all_gather_single(sizes, local)
    longest = sizes.view(world, len(leaves)).amax(dim=0).tolist()
    return _rebuild(tensor, [_pad_one(t, d, n, pad_index, pad_first)
                             for t, d, n in zip(leaves, dims, longest)])

