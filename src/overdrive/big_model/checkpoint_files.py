"""Finding and checking a checkpoint before loading it: one file, a folder with one weights file, or a
folder of shards with its ``*.index.json``; safetensors or ``pytorch_model.bin`` (read with
``weights_only=True``, never unpickling code).

:func:`open_checkpoint` reads only headers (safetensors) or the lazily mapped tensor metadata (``.bin``), so
every shard's names, shapes and integrity are known, and every problem is reported, before any weight of
the model changes.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from overdrive.big_model.planning import _device_for
from overdrive.big_model.safetensors_io import SafetensorsError, SafetensorsFile
from overdrive.big_model.tensors import resolve_device

__all__ = ["CheckpointError", "Shard", "Checkpoint", "find_checkpoint_files", "open_checkpoint", "load_state_dict"]

WEIGHTS_NAME = "pytorch_model.bin"
SAFE_WEIGHTS_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this model; the message lists every problem found."""


@dataclass
class Shard:
    """One checkpoint file: its tensors' shapes and dtypes, read without loading the data."""

    path: str
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    safetensors: SafetensorsFile | None = None

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """``(name, reader)`` pairs; ``reader(out=None)`` returns the tensor as a new CPU tensor (or reads
        it into ``out``), ``reader(mapped=True)`` a zero-copy view of a safetensors shard's file mapping
        (see :meth:`SafetensorsFile.view`; a ``.bin`` shard's tensors are still copied). A ``.bin``
        shard is mapped once here and released when the iteration ends."""
        if self.safetensors is not None:
            file = self.safetensors
            for name in self.shapes:
                yield name, lambda out=None, mapped=False, name=name: (
                    file.view(name, shared_map=True) if mapped else file.read(name, out))
            return
        state = _torch_load(self.path)
        try:
            for name in self.shapes:
                yield name, lambda out=None, mapped=False, t=state[name]: _copy_out(t, out)
        finally:
            del state


@dataclass
class Checkpoint:
    """Every shard of a checkpoint, and which shard holds each tensor."""

    source: str
    shards: list[Shard] = field(default_factory=list)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor name of the checkpoint with its shape."""
        return {name: shape for shard in self.shards for name, shape in shard.shapes.items()}

    def largest_shard_bytes(self) -> int:
        """Size of the biggest shard file."""
        return max((os.path.getsize(shard.path) for shard in self.shards), default=0)


def _copy_out(tensor: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    # copy out of the file mapping: the model must not hold pages of a file that may change or vanish
    if out is None:
        out = torch.empty(tensor.shape, dtype=tensor.dtype)
    out.copy_(tensor)
    return out


def _torch_load(path: str) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        # files in torch's legacy (pre-zip) format cannot be mapped
        return torch.load(path, map_location="cpu", weights_only=True)


def find_checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The weight files of ``checkpoint`` (a file, an ``*.index.json``, or a folder holding either)."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        return _from_index(path) if path.endswith(".json") else [path]
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist; give a weights file, a *.index.json or a "
                              "folder holding one")
    names = os.listdir(path)
    for single in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if single in names:
            return [os.path.join(path, single)]
    indexes = sorted(n for n in names if n.endswith(".index.json"))
    if len(indexes) == 1:
        return _from_index(os.path.join(path, indexes[0]))
    what = f"several index files {indexes}" if indexes else "no index file"
    raise CheckpointError(f"{path} holds {what}; expected one *.index.json, a {WEIGHTS_NAME} or a "
                          f"{SAFE_WEIGHTS_NAME} (or pass the file itself)")


def _from_index(index_path: str) -> list[str]:
    try:
        with open(index_path, encoding="utf-8") as file:
            index = json.load(file)
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read the checkpoint index {index_path}: {err}") from None
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path} has no weight_map (a mapping of tensor names to shard files)")
    folder = os.path.dirname(index_path)
    files = [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise CheckpointError(f"{index_path} lists shard(s) that do not exist: {missing}")
    return files


def _open_shard(path: str) -> Shard:
    if path.endswith(".safetensors"):
        file = SafetensorsFile(path)
        return Shard(path, {n: e.shape for n, e in file.entries.items()},
                     {n: e.dtype for n, e in file.entries.items()}, file)
    state = _torch_load(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors (found {type(state).__name__})")
    return Shard(path, {n: tuple(t.shape) for n, t in state.items()}, {n: t.dtype for n, t in state.items()})


def open_checkpoint(checkpoint: str | os.PathLike[str]) -> Checkpoint:
    """Find and check every shard of ``checkpoint``; all unreadable shards are listed in one error."""
    result = Checkpoint(os.fspath(checkpoint))
    problems = []
    for path in find_checkpoint_files(checkpoint):
        try:
            result.shards.append(_open_shard(path))
        except (SafetensorsError, CheckpointError) as err:
            problems.append(str(err))
        except pickle.UnpicklingError:
            problems.append(f"{path} holds Python objects other than tensors; it is refused because unpickling "
                            "them could run code from the file (load it only if you trust it, and re-save the "
                            "tensors as safetensors)")
        except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as err:
            problems.append(f"{path} cannot be read as a PyTorch weights file ({type(err).__name__}: {err}); "
                            "it is probably truncated or corrupt")
    if problems:
        raise CheckpointError("corrupt checkpoint shard(s):\n  " + "\n  ".join(problems))
    return result


def load_state_dict(checkpoint_file: str | os.PathLike[str], device_map: dict[str, Any] | None = None
                    ) -> dict[str, torch.Tensor]:
    """All tensors of one weights file, on the CPU (or, with ``device_map``, on each tensor's device;
    ``"disk"`` tensors stay on the CPU). A safetensors file's CPU tensors are zero-copy views of its
    mapping, as with Accelerate (see :meth:`SafetensorsFile.view`)."""
    shard = _open_shard(os.fspath(checkpoint_file))
    state = {name: read(mapped=True) for name, read in shard.tensors()}
    if device_map:
        for name, tensor in state.items():
            device = _device_for(name, device_map)
            if device not in (None, "cpu", "disk"):
                state[name] = tensor.to(resolve_device(device))
    return state
