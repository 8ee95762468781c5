"""Disk space for a save: checked before writing, and named when a write runs out of it anyway.

A full disk otherwise surfaces as whatever the writer says at that moment (``enforce fail at
inline_container.cc ... unexpected pos`` from torch's zip writer, or a bare ``OSError``): the message here
says that the disk is full, where, how much the save needed and how much was free.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import torch

from overdrive.checkpoint.errors import CheckpointError

#: Besides the tensors: DCP's metadata and headers, the JSON files, the manifest.
_OVERHEAD_BYTES = 1 << 20
_FULL_MARKERS = ("no space left", "unexpected pos", "disk quota exceeded", "file too large")


def tensor_bytes(flat: dict[str, Any]) -> int:
    """The bytes the tensors of ``flat`` take on disk (local shards of distributed tensors only)."""
    total = 0
    for value in flat.values():
        local = getattr(value, "_local_tensor", value)  # a DTensor writes its own shard
        if isinstance(local, torch.Tensor):
            total += local.numel() * local.element_size()
    return total


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def free_bytes(folder: Path) -> int:
    """Free bytes on the file system of ``folder`` (of its nearest existing parent if not made yet)."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free


def disk_full_message(folder: Path, needed: int, free: int | None = None) -> str:
    """The error text for a save that does not fit: how much this process needs in ``folder``, how much
    is free (measured when ``free`` is not given) and what to do."""
    free = free_bytes(folder) if free is None else free
    return (f"the disk is full: this process's part of the checkpoint needs about {_mib(needed)} in {folder}, "
            f"and that file system has {_mib(free)} free. Free some space (older checkpoints: total_limit) or "
            "save to another folder; nothing was published and earlier checkpoints are untouched")


def check_space(folder: Path, flat: dict[str, Any]) -> int:
    """Raise ``CheckpointError`` before anything large is written if ``folder`` cannot hold this process's
    part of the checkpoint; return the bytes it needs."""
    needed = tensor_bytes(flat) + _OVERHEAD_BYTES
    free = free_bytes(folder)
    if free < needed:
        raise CheckpointError(disk_full_message(folder, needed, free))
    return needed


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it, or the failures DCP collected) is a full disk."""
    seen = 0
    pending = [error]
    while pending and seen < 20:
        current = pending.pop()
        seen += 1
        if current is None:
            continue
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        if any(marker in str(current).lower() for marker in _FULL_MARKERS):
            return True
        failures = getattr(current, "failures", None)  # DCP's CheckpointException: rank -> exception
        if isinstance(failures, dict):
            for failure in failures.values():
                pending.append(failure[0] if isinstance(failure, tuple) else failure)
        pending += [current.__cause__, current.__context__]
    return False
