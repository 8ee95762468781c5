"""Checkpoint state that is not a big tensor, as plain JSON: nothing is unpickled to read it back.

Schedulers' state dicts, counters, data-loader positions, RNG states and the non-tensor parts of
registered objects are written with :func:`encode` and read with :func:`decode`. JSON has no tuples,
tensors, NumPy arrays, non-finite floats or dictionaries with non-string keys, so those are written as
one-key objects tagged ``"__tuple__"``, ``"__tensor__"`` ... . A tensor is either inlined (base64 of its
bytes, for small ones such as RNG states) or handed to a *sink* that stores it elsewhere (in the sharded
DCP files) and returns a reference.

A value that none of this can represent (an arbitrary Python object) is pickled into a ``"__pickle__"``
entry so that saving never fails; :func:`decode` refuses it unless the caller opts in with
``allow_pickle=True``, and its error names where the value sits.
"""

from __future__ import annotations

import base64
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from overdrive.checkpoint.errors import CheckpointError

TUPLE, TENSOR, NDARRAY, FLOAT, ITEMS, REF, PICKLE, DTYPE = (
    "__tuple__", "__tensor__", "__ndarray__", "__float__", "__items__", "__ref__", "__pickle__", "__dtype__")
_TAGS = frozenset({TUPLE, TENSOR, NDARRAY, FLOAT, ITEMS, REF, PICKLE, DTYPE})

TensorSink = Callable[[torch.Tensor, str], str]
TensorSource = Callable[[str], torch.Tensor]


def encode(value: Any, sink: TensorSink | None = None, path: str = "", pickled: list[str] | None = None) -> Any:
    """``value`` as JSON-compatible data.

    ``sink(tensor, path)`` stores a tensor and returns the key to find it again (tensors are inlined
    without a sink); ``pickled`` collects the paths of values that had to be pickled.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {FLOAT: repr(value)}
    if isinstance(value, torch.Tensor):
        return {REF: sink(value, path)} if sink is not None else {TENSOR: _tensor_to_json(value)}
    if isinstance(value, torch.dtype):
        return {DTYPE: str(value).removeprefix("torch.")}
    if isinstance(value, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in value):
            return {k: encode(v, sink, _join(path, k), pickled) for k, v in value.items()}
        return {ITEMS: [[encode(k, None, path, pickled), encode(v, sink, _join(path, str(k)), pickled)]
                        for k, v in value.items()]}
    if isinstance(value, list):
        return [encode(v, sink, _join(path, str(i)), pickled) for i, v in enumerate(value)]
    if type(value) is tuple or isinstance(value, torch.Size):
        return {TUPLE: [encode(v, sink, _join(path, str(i)), pickled) for i, v in enumerate(value)]}
    array = _numpy_array(value)
    if array is not None:
        return {NDARRAY: array}
    if pickled is not None:
        pickled.append(path or "<root>")
    return {PICKLE: base64.b64encode(pickle.dumps(value)).decode("ascii"), "type": _type_name(value)}


def decode(data: Any, source: TensorSource | None = None, allow_pickle: bool = False, path: str = "") -> Any:
    """The value :func:`encode` wrote. ``source(key)`` returns a tensor stored by a sink."""
    if isinstance(data, list):
        return [decode(v, source, allow_pickle, _join(path, str(i))) for i, v in enumerate(data)]
    if not isinstance(data, dict):
        return data
    tags = [key for key in data if key in _TAGS]  # a plain dict never has a tag key (encode escapes it)
    if tags:
        return _decode_tagged(tags[0], data, source, allow_pickle, path)
    return {k: decode(v, source, allow_pickle, _join(path, k)) for k, v in data.items()}


def _decode_tagged(tag: str, data: dict, source: TensorSource | None, allow_pickle: bool, path: str) -> Any:
    body = data[tag]
    if tag == TUPLE:
        return tuple(decode(v, source, allow_pickle, _join(path, str(i))) for i, v in enumerate(body))
    if tag == FLOAT:
        return float(body)
    if tag == TENSOR:
        return _tensor_from_json(body, path)
    if tag == DTYPE:
        return _dtype(body, path)
    if tag == NDARRAY:
        return _array_from_json(body, path)
    if tag == REF:
        if source is None:
            raise CheckpointError(f"{path}: a tensor stored outside the JSON file, but no tensor source was given")
        return source(body)
    if tag == ITEMS:
        return {decode(k, None, allow_pickle, path): decode(v, source, allow_pickle, _join(path, str(k)))
                for k, v in body}
    # PICKLE
    if not allow_pickle:
        raise CheckpointError(
            f"{path or 'the state'} holds a {data.get('type', 'Python object')} that can only be restored by "
            "unpickling, which can run arbitrary code; if you trust this checkpoint, load it with "
            "load_state(..., allow_pickle=True), or make the object's state_dict() return only numbers, "
            "strings, lists, dicts, tuples and tensors")
    return pickle.loads(base64.b64decode(body))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _dtype(name: str, path: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{path}: unknown tensor dtype {name!r} in the checkpoint")
    return dtype


def _tensor_to_json(tensor: torch.Tensor) -> dict[str, Any]:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(tensor.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def _tensor_from_json(body: dict[str, Any], path: str) -> torch.Tensor:
    dtype, shape = _dtype(body["dtype"], path), [int(s) for s in body["shape"]]
    raw = base64.b64decode(body["data"])
    if not raw:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if flat.numel() != math.prod(shape) * torch.empty((), dtype=dtype).element_size():
        raise CheckpointError(f"{path}: the stored tensor has {flat.numel()} bytes, which does not fit its "
                              f"shape {shape} and dtype {dtype} (corrupted state file)")
    return flat.view(dtype).reshape(shape).clone()


def _numpy_array(value: Any) -> dict[str, Any] | None:
    """A NumPy array or scalar as JSON (``None`` for anything else, or object arrays)."""
    kind = type(value)
    if not kind.__module__.startswith("numpy"):
        return None

    if not isinstance(value, (np.ndarray, np.generic)) or np.asarray(value).dtype.hasobject:
        return None
    array = np.ascontiguousarray(value)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "scalar": isinstance(value, np.generic),
            "data": base64.b64encode(array.tobytes()).decode("ascii")}


def _array_from_json(body: dict[str, Any], path: str) -> Any:
    dtype = np.dtype(body["dtype"])
    if dtype.hasobject:
        raise CheckpointError(f"{path}: NumPy arrays of Python objects cannot be read without unpickling")
    array = np.frombuffer(base64.b64decode(body["data"]), dtype=dtype).reshape(body["shape"]).copy()
    return array[()] if body.get("scalar") else array
