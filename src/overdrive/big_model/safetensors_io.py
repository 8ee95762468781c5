"""Reading safetensors files tensor by tensor, without the ``safetensors`` package's whole-file loads.

The format is 8 bytes of header length, a JSON header ``{name: {dtype, shape, data_offsets}}`` and the
raw data. Reading the header is cheap, so every shard of a checkpoint can be checked (names, shapes, offsets
inside the file) before any weight is touched. Tensors are then read straight into their final buffer
(``readinto``: no intermediate copy), or viewed zero-copy through a private memory map: weights loaded
to stay on the CPU and offloaded weights read again at every forward (see
:mod:`overdrive.big_model.mapped_files`).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from overdrive.big_model.mapped_files import MappedFileError, guard, shrank_message

__all__ = ["SafetensorsError", "TensorEntry", "SafetensorsFile", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_MAX_HEADER = 100 * 2**20


def _pread_into(fd: int, buffer: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buffer], offset)  # no shared file offset: safe from several threads
    with open(fd, "rb", buffering=0, closefd=False) as file:
        file.seek(offset)
        return file.readinto(buffer) or 0


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
        # held open: every read and map sees the file as it was opened, even if the path is later replaced
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)
        self.entries, self.metadata = self._read_header()
        self._shared_map: mmap.mmap | None = None

    def _fail(self, why: str) -> SafetensorsError:
        return SafetensorsError(f"{self.path} is not a valid safetensors file: {why} (re-save or re-download it)")

    def _read_header(self) -> tuple[dict[str, TensorEntry], dict[str, str]]:
        self.size = size = os.fstat(self._fd).st_size
        with open(self._fd, "rb", closefd=False) as file:
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
        done = 0
        while done < entry.nbytes:
            got = _pread_into(self._fd, view[done:], entry.start + done)
            if not got:
                raise self._fail(f"the data of {name!r} ends early")
            done += got
        return out

    def view(self, name: str, shared_map: bool = False) -> torch.Tensor:
        """Tensor ``name`` backed by a private (copy-on-write) memory map of the file: no copy, pages read
        from the page cache on first use (and shared with every process mapping the file). Writes to it
        copy the page written and never reach the file; a truncation of the file under the map raises
        :class:`~overdrive.big_model.mapped_files.MappedFileError` instead of crashing the process.

        ``shared_map=False`` maps the file for this tensor alone (the map closes when the tensor is freed,
        so offloaded pages leave the process's memory after each use); ``True`` reuses one map of the file
        for every tensor viewed so (weights loaded to stay on the CPU)."""
        entry = self.entries[name]
        if entry.nbytes == 0 or entry.start % entry.dtype.itemsize:
            return self.read(name)  # empty, or unaligned data that a typed view cannot address
        mapped = self._shared_map if shared_map else None
        if mapped is None:
            mapped = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
            if len(mapped) < self.size:
                raise MappedFileError(shrank_message(self.path, self.size, len(mapped), "while its weights were in use"))
            guard(mapped, torch.frombuffer(mapped, dtype=torch.uint8, count=1).data_ptr(), self.path)
            if shared_map:
                self._shared_map = mapped
        flat = torch.frombuffer(mapped, dtype=entry.dtype, count=entry.nbytes // entry.dtype.itemsize,
                                offset=entry.start)
        return flat.view(entry.shape)
