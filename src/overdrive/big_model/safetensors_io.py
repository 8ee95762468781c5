"""Reading safetensors files tensor by tensor, without the ``safetensors`` package's whole-file loads.

The format is 8 bytes of header length, a JSON header ``{name: {dtype, shape, data_offsets}}`` and the
raw data. Reading the header is cheap, so every shard of a checkpoint can be checked (names, shapes, offsets
inside the file) before any weight is touched. Tensors are then read straight into their final buffer
(``readinto``: no intermediate copy, and no mapped pages counted in the process's memory), or viewed
zero-copy through a private memory map for offloaded weights that are read again at every forward.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SafetensorsError", "TensorEntry", "SafetensorsFile", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_MAX_HEADER = 100 * 2**20


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read as one (truncated, corrupt header, offsets out of range)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in its file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


class SafetensorsFile:
    """One safetensors file: its validated header, and tensors read on demand.

    Raises :class:`SafetensorsError` naming the file and the problem if the header or the offsets are
    inconsistent with the file's size.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.entries, self.metadata = self._read_header()

    def _fail(self, why: str) -> SafetensorsError:
        return SafetensorsError(f"{self.path} is not a valid safetensors file: {why} (re-save or re-download it)")

    def _read_header(self) -> tuple[dict[str, TensorEntry], dict[str, str]]:
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as file:
            head = file.read(8)
            if len(head) < 8:
                raise self._fail(f"it has {size} bytes, fewer than the 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > min(_MAX_HEADER, size - 8):
                raise self._fail(f"its header claims {length} bytes but the file has {size}")
            try:
                header = json.loads(file.read(length))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise self._fail(f"its header is not JSON ({err})") from None
        if not isinstance(header, dict):
            raise self._fail("its header is not a JSON object")
        base = 8 + length
        metadata = header.pop("__metadata__", None) or {}
        entries = {name: self._entry(name, info, base, size) for name, info in header.items()}
        return entries, metadata

    def _entry(self, name: str, info: Any, base: int, size: int) -> TensorEntry:
        try:
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise self._fail(f"the header entry of {name!r} is malformed: {info!r}") from None
        numel = 1
        for dim in shape:
            numel *= dim
        if end - begin != numel * dtype.itemsize or begin < 0 or base + end > size:
            raise self._fail(f"tensor {name!r} ({info['dtype']}, shape {list(shape)}) has data offsets "
                             f"[{begin}, {end}) that do not fit its size or the file ({size} bytes); "
                             "the file is probably truncated")
        return TensorEntry(dtype, shape, base + begin, end - begin)

    def keys(self) -> list[str]:
        """The tensor names, in header order."""
        return list(self.entries)

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor ``name`` as a new CPU tensor (or read into ``out``, a contiguous CPU tensor of its
        dtype and shape)."""
        entry = self.entries[name]
        if out is None:
            out = torch.empty(entry.shape, dtype=entry.dtype)
        if entry.nbytes == 0:
            return out
        view = out.view(-1).view(torch.uint8).numpy().data.cast("B")
        with open(self.path, "rb", buffering=0) as file:
            file.seek(entry.start)
            done = 0
            while done < entry.nbytes:
                got = file.readinto(view[done:])
                if not got:
                    raise self._fail(f"the data of {name!r} ends early")
                done += got
        return out

    def view(self, name: str) -> torch.Tensor:
        """Tensor ``name`` backed by a private (copy-on-write) memory map of the file: no copy, pages read
        on first use. Writes to it never reach the file."""
        entry = self.entries[name]
        if entry.nbytes == 0 or entry.start % entry.dtype.itemsize:
            return self.read(name)  # empty, or unaligned data that a typed view cannot address
        # a map per view: it closes when the tensor is freed, so offloaded pages leave the process's memory
        with open(self.path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(mapped, dtype=entry.dtype, count=entry.nbytes // entry.dtype.itemsize,
                                offset=entry.start)
        return flat.view(entry.shape)
