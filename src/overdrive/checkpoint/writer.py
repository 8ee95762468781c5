"""A rank's DCP files, written with their CRC-32 computed on the way out.

DCP's ``FileSystemWriter`` writes every tensor with ``torch.save``, whose zip writer computes a CRC-32 of
each record (miniz's, slow enough to be most of the CPU time of a save: docs/benchmarks.md), and the manifest
then needed a second CRC-32 (zlib's) of every finished file, read back from the page cache.
:class:`ChecksummingWriter` writes the same files (same layout, each tensor a ``torch.save`` archive at the
offset the metadata records, so DCP's reader and ``torch.load`` read them unchanged) with the archives'
per-record CRCs left out (``torch.load`` does not need them: see ``torch.serialization.set_crc32_options``)
and computes each file's CRC-32 with zlib while it writes it, a few MiB at a time while the bytes are still
in the CPU's cache. The manifest records that CRC; ``load_state`` checks whole files against it as before.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from overdrive.runtime.torch_private import save_without_crc as save_tensor
from overdrive.runtime.torch_private import storage_info

#: Bytes checksummed and then written at a time: small enough to stay in the CPU's cache in between.
PIECE = 1 << 20


class _ChecksummedFile:
    """A write-only stream that passes every byte on to ``file`` and keeps their CRC-32 and count."""

    def __init__(self, file: Any) -> None:
        self.file, self.crc, self.size = file, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE):
            piece = view[start:start + PIECE]
            self.crc = zlib.crc32(piece, self.crc)  # releases the GIL: the writer threads run side by side
            self.file.write(piece)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.file.flush()


def _buckets(count: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """``items`` over ``count`` files of about equal size (largest tensors first, each to the lightest file);
    byte items round-robin, as DCP's writer splits them."""
    buckets: list[list[WriteItem]] = [[] for _ in range(count)]
    sizes = [0] * count
    tensors = [item for item in items if item.type != WriteItemType.BYTE_IO]
    for i, item in enumerate(item for item in items if item.type == WriteItemType.BYTE_IO):
        buckets[i % count].append(item)

    def size(item: WriteItem) -> int:
        data = item.tensor_data
        return 0 if data is None else data.size.numel() * data.properties.dtype.itemsize

    for item in sorted(tensors, key=size, reverse=True):
        lightest = sizes.index(min(sizes))
        buckets[lightest].append(item)
        sizes[lightest] += size(item)
    return [bucket for bucket in buckets if bucket]


class ChecksummingWriter(FileSystemWriter):
    """``FileSystemWriter`` (one file per writer thread, fsync'ed) that records each file's size and CRC-32
    in :attr:`checksums` (``{name: {"size": bytes, "crc32": hex}}``) as it writes it."""

    def __init__(self, path: str | os.PathLike, thread_count: int) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=thread_count)
        self.checksums: dict[str, dict[str, Any]] = {}

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data.prefix
        jobs = [(f"{prefix}{i}{DEFAULT_SUFFIX}", bucket) for i, bucket in enumerate(_buckets(self.thread_count,
                                                                                            plan.items))]
        if len(jobs) > 1:
            with ThreadPoolExecutor(max_workers=len(jobs) - 1) as pool:
                others = [pool.submit(self._write_file, name, bucket, planner) for name, bucket in jobs[1:]]
                results = self._write_file(*jobs[0], planner)
                for other in others:
                    results += other.result()
        else:
            results = self._write_file(*jobs[0], planner) if jobs else []
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def _write_file(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        results = []
        with open(Path(self.path) / name, "wb") as file:
            out = _ChecksummedFile(file)
            for item in items:
                offset = out.size
                data: Any = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:  # an io.BytesIO
                    out.write(data.getbuffer())
                else:
                    tensor = data.detach().cpu()
                    if tensor.untyped_storage().nbytes() != tensor.nbytes:  # a view: write its elements only
                        tensor = tensor.clone()
                    save_tensor(tensor, out)
                results.append(WriteResult(index=item.index, size_in_bytes=out.size - offset,
                                           storage_data=storage_info(name, offset, out.size - offset)))
            file.flush()
            os.fsync(file.fileno())
        self.checksums[name] = {"size": out.size, "crc32": f"{out.crc & 0xFFFFFFFF:08x}"}
        return results
