"""Files of a checkpoint: the manifest that proves it whole, and reading DCP files without unsafe unpickling.

``torch.distributed.checkpoint``'s ``FileSystemReader`` reads its ``.metadata`` file with ``pickle.load``
and its planner reads non-tensor values with ``torch.load(weights_only=False)``: either runs whatever
code a crafted file asks for. :class:`SafeFileSystemReader` unpickles ``.metadata`` with an unpickler
that can build only DCP's own metadata classes, torch dtypes, sizes and paths, and
:class:`SafeLoadPlanner` reads non-tensor values with ``torch.load(weights_only=True)``. Tensors are
already read with ``weights_only=True`` by DCP itself. ``allow_pickle=True`` restores torch's behaviour
for checkpoints the user trusts.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from overdrive._version import __version__
from overdrive.checkpoint import fastread
from overdrive.checkpoint.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "overdrive.checkpoint"
FORMAT_VERSION = 1
DCP_METADATA = ".metadata"
_CHUNK = 256 << 10


# -- plain files ----------------------------------------------------------------------------------
def checksum(path: str | os.PathLike) -> str:
    """CRC-32 of a file, as 8 hex digits (zlib's runs at several GB/s: see docs/checkpoints.md).

    The file is read into one reused 256 KiB buffer (it stays in the CPU's cache between the read and the
    CRC). Not through a memory map, although that is faster from the page cache: a mapped file
    that another process truncates kills the reader with SIGBUS when it touches the lost pages, while a read
    just ends early (verify_files then reports the file as truncated)."""
    crc = 0
    buffer = bytearray(_CHUNK)  # reused: a fresh chunk per read costs page faults, slower than the CRC
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while size := f.readinto(buffer):
            crc = zlib.crc32(view[:size], crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def describe(folder: Path, name: str, rank: int) -> dict[str, Any]:
    """What the manifest records of one file: size, checksum and the rank that wrote it. The file is
    flushed to the disk first (it becomes part of a checkpoint that is published after this)."""
    path = folder / name
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return {"size": path.stat().st_size, "crc32": checksum(path), "rank": rank}


def describe_many(folder: Path, names: list[str], rank: int) -> dict[str, dict[str, Any]]:
    """:func:`describe` of several files at once (zlib's CRC releases the GIL: one thread per file)."""
    if len(names) < 2:
        return {name: describe(folder, name, rank) for name in names}

    with ThreadPoolExecutor(max_workers=min(len(names), 4)) as pool:
        return dict(zip(names, pool.map(lambda name: describe(folder, name, rank), names)))


def write_json(path: Path, data: Any, sync: bool = True) -> None:
    """Write ``data`` as JSON and (``sync``) flush it to the disk (it is renamed into place later; without
    ``sync``, :func:`describe` flushes it when the manifest records it)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"), allow_nan=False)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def read_json(path: Path) -> Any:
    """Read a JSON file of a checkpoint.

    Raises:
        CheckpointError: the file is missing, truncated or not JSON (the message names the path)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): the file is truncated or corrupted") from None


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- the manifest ---------------------------------------------------------------------------------
def manifest_data(files: dict[str, dict[str, Any]], world_size: int, contents: dict[str, Any]) -> dict[str, Any]:
    """The manifest's content: format and versions, the world size that wrote it, what it holds
    (``contents``) and each file's size and checksum (``files``, sorted by name)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "world_size": world_size,
            "versions": {"overdrive": __version__, "torch": torch.__version__}, "checksum": "crc32",
            "contents": contents, "files": dict(sorted(files.items()))}


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of ``folder``, checked for format and version."""
    path = folder / MANIFEST
    if not path.is_file():
        if not folder.is_dir():
            raise CheckpointError(f"checkpoint folder {folder} does not exist")
        raise CheckpointError(f"{folder} has no {MANIFEST}: it is not an overdrive checkpoint, or the save that "
                              "wrote it did not finish")
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an overdrive checkpoint manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {version!r}; this overdrive reads versions up to "
                              f"{FORMAT_VERSION}: upgrade overdrive to load it")
    return manifest


def verify_files(folder: Path, manifest: dict[str, Any], names: list[str], with_checksums: bool = True) -> list[str]:
    """The problems of the files ``names`` of the manifest (missing, wrong size, wrong checksum)."""
    problems = []
    world = manifest.get("world_size")
    sums: dict[str, str] = {}
    if with_checksums and len(names) > 1:  # every file's CRC at once (zlib releases the GIL)

        present = [n for n in names if (folder / n).is_file()]
        with ThreadPoolExecutor(max_workers=min(len(present), 4) or 1) as pool:
            sums = dict(zip(present, pool.map(lambda n: checksum(folder / n), present)))
    for name in names:
        entry = manifest["files"][name]
        path = folder / name
        writer = "written by a save hook" if entry.get("rank") is None else f"written by rank {entry['rank']} of {world}"
        if not path.is_file():
            problems.append(f"{path} is missing ({writer})")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{path} is {size} bytes but the manifest says {entry['size']} ({writer}): the file "
                            "is truncated or was changed after the save")
        elif with_checksums and (found := sums.get(name) or checksum(path)) != entry["crc32"]:
            problems.append(f"{path} has checksum {found} but the manifest says {entry['crc32']} ({writer}): "
                            "the file is corrupted")
    return problems


# -- safe DCP reading -----------------------------------------------------------------------------
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "BytesStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata and nothing else: any other class or function in the file is refused.

    Every allowed name is a data class, an enum, a size, a path or torch's layout lookup, so a crafted
    file can at worst build wrong metadata, which the checks after it report.
    """

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"{self.path} refers to {module}.{name}, which is not part of DCP's checkpoint metadata; it was not "
            "unpickled. If the checkpoint comes from a newer torch or you trust it, load it with "
            "allow_pickle=True")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read without running code from the file."""

    def __init__(self, path: str | os.PathLike, allow_pickle: bool = False) -> None:
        super().__init__(path)
        self.allow_pickle = allow_pickle

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # rank-local metadata: written only without collectives
            raise FileNotFoundError("overdrive checkpoints have one global .metadata file")
        path = Path(self.path) / DCP_METADATA
        try:
            with open(path, "rb") as f:
                metadata = pickle.load(f) if self.allow_pickle else _MetadataUnpickler(f, path).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: the checkpoint has no DCP metadata") from None
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways
            raise CheckpointError(f"{path} cannot be read ({type(exc).__name__}: {exc}): the file is truncated "
                                  "or corrupted") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} does not hold DCP metadata (found {type(metadata).__name__})")
        check_inside(Path(self.path), metadata)
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read whole tensors straight into their targets (``fastread``), file by file in offset order; the
        other items through DCP's own reader."""
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        rest: list[ReadItem] = []
        for relative, items in per_file.items():
            items.sort(key=lambda item: self.storage_data[item.storage_index].offset)
            with open(Path(self.path) / relative, "rb", buffering=0) as file:
                for item in items:
                    info = self.storage_data[item.storage_index]
                    if info.transform_descriptors or not fastread.read_in_place(file, info.offset, info.length, item, planner):
                        rest.append(item)
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def check_inside(folder: Path, metadata: Metadata) -> None:
    """Refuse metadata whose storage entries point outside ``folder`` (``../other/...``, absolute paths,
    links): the manifest's checksums cover only the folder's own files."""
    root = folder.resolve()
    checked: set[str] = set()  # hundreds of entries share a few files: resolve each path once
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        relative = str(getattr(info, "relative_path", ""))
        if relative in checked:
            continue
        checked.add(relative)
        resolved = (root / relative).resolve()
        if not relative or os.path.isabs(relative) or not resolved.is_relative_to(root) or resolved == root:
            key = getattr(index, "fqn", index)
            raise CheckpointError(f"{folder / DCP_METADATA} says {key!r} is stored in {relative!r}, which is "
                                  f"outside the checkpoint folder {folder}: refusing to read it (a crafted or "
                                  "damaged checkpoint)")


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner for a flat state dict, reading non-tensor values with ``weights_only=True``."""

    def __init__(self, allow_pickle: bool = False) -> None:
        super().__init__(flatten_state_dict=False)
        self.allow_pickle = allow_pickle

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=not self.allow_pickle)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"the value {key!r} in the checkpoint is not made of plain numbers, strings, containers and "
                f"tensors, so it was not unpickled ({exc}); if you trust this checkpoint, load it with "
                "allow_pickle=True") from None
        # set_up_planner may have copied the dict: the caller's (original) one must get the value
        self.state_dict[key] = loaded
        self.original_state_dict[key] = loaded
