"""Reading DCP tensor items straight into the tensors they restore.

DCP's ``FileSystemReader`` loads every tensor item with ``torch.load`` into a new tensor, then copies it into
the target: the bytes are moved twice and a checkpoint-sized amount of fresh memory is touched on the way.
Each item is a ``torch.save`` archive whose storage is one uncompressed record, so when the saved tensor
is a whole, contiguous storage of the target's dtype and shape, its bytes can be read from the file into the
target's own memory in one ``readinto``. The archive's header is read on the meta device (no data), and
anything else (a view, another dtype, a resharded read, a big-endian file, a transform) goes through DCP's
own path unchanged.
"""

from __future__ import annotations

import io
import struct
import sys
import zipfile
from typing import Any

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from overdrive.runtime.torch_private import weights_only_unpickler


class _Slice(io.RawIOBase):
    """A read-only window ``[start, start + length)`` of an open file (what ``torch.load`` reads an item from)."""

    def __init__(self, file: Any, start: int, length: int) -> None:
        super().__init__()
        self.file, self.start, self.length, self.position = file, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, min(self.length, base + offset))
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self.length - self.position)
        if wanted <= 0:
            return 0
        self.file.seek(self.start + self.position)
        got = self.file.readinto(view[:wanted]) or 0
        self.position += got
        return got


def read_in_place(file: Any, item_offset: int, item_length: int, request: ReadItem, planner: LoadPlanner) -> bool:
    """Read one tensor item of ``file`` (its archive at ``item_offset``) into its target; False (nothing read)
    when the item is not a whole contiguous tensor of the target's dtype and shape: DCP then reads it."""
    if request.type != LoadItemType.TENSOR or any(request.storage_offsets):
        return False
    target = planner.resolve_tensor(request).detach()
    if target.device.type != "cpu" or not target.is_contiguous() or target.is_quantized or target.is_sparse:
        return False
    try:
        found = _saved_tensor(_Slice(file, item_offset, item_length))
    except Exception:  # noqa: BLE001 - anything unusual is DCP's to read (and to report)
        return False
    if found is None:
        return False
    saved, data_offset = found
    if (type(saved) is not torch.Tensor or saved.dtype != target.dtype or saved.shape != target.shape
            or tuple(request.lengths) != tuple(target.shape) or not saved.is_contiguous()
            or saved.storage_offset() != 0 or saved.untyped_storage().nbytes() != target.numel() * target.element_size()):
        return False
    if target.numel():
        _read_exactly(file, item_offset + data_offset, target)
        torch.autograd.graph.increment_version(target)  # what copy_ would record: the tensor changed
    planner.commit_tensor(request, target)
    return True


def _saved_tensor(archive: _Slice) -> tuple[Any, int] | None:
    """What ``torch.save`` put in ``archive``, built on the meta device (its header only: no data read), and
    where its storage's bytes start in the archive; None for anything but one uncompressed storage in this
    machine's byte order.

    Records are read raw, without checking their zip CRC-32: overdrive's writer leaves those out (the
    manifest's CRC-32 covers the whole file; see ``checkpoint/writer.py``)."""
    with zipfile.ZipFile(archive) as members:
        prefix = members.namelist()[0].split("/", 1)[0]
        names = set(members.namelist())
        order = _record(archive, members.getinfo(f"{prefix}/byteorder")).decode() \
            if f"{prefix}/byteorder" in names else "little"
        if order != sys.byteorder:
            return None
        keys: list[str] = []

        def storage(pid: Any) -> Any:  # the one kind of persistent id torch.save writes: a storage
            _, storage_type, key, _location, numel = pid
            dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
            keys.append(key)
            untyped = torch.UntypedStorage(numel * dtype.itemsize, device="meta")
            return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

        unpickler = weights_only_unpickler(io.BytesIO(_record(archive, members.getinfo(f"{prefix}/data.pkl"))))
        unpickler.persistent_load = storage
        saved = unpickler.load()
        if len(keys) != 1:
            return None
        record = members.getinfo(f"{prefix}/data/{keys[0]}")
    return saved, _record_start(archive, record)


def _record_start(archive: _Slice, record: zipfile.ZipInfo) -> int:
    """Where the bytes of the uncompressed ``record`` start in ``archive`` (after its local file header)."""
    if record.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{record.filename} is compressed")
    archive.seek(record.header_offset)
    header = archive.read(30)  # the local file header: its name and extra field lengths end it
    if header is None or len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ValueError(f"{record.filename} has no local file header")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return record.header_offset + 30 + name_length + extra_length


def _record(archive: _Slice, record: zipfile.ZipInfo) -> bytes:
    """The bytes of a small uncompressed record, read raw."""
    archive.seek(_record_start(archive, record))
    data = archive.read(record.file_size)
    if data is None or len(data) != record.file_size:
        raise ValueError(f"{record.filename} is cut short")
    return data


def _read_exactly(file: Any, offset: int, target: torch.Tensor) -> None:
    view = target.reshape(-1).view(torch.uint8).numpy().data  # the tensor's own memory, writable
    file.seek(offset)
    done = 0
    while done < len(view):
        got = file.readinto(view[done:])
        if not got:
            raise OSError(f"{getattr(file, 'name', 'checkpoint file')} ended {len(view) - done} bytes early at "
                          f"offset {offset + done}")
        done += got
