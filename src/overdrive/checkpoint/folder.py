"""One state dict in one DCP folder, with the checkpoint package's guarantees: written into a hidden
sibling and published by a rename once every rank wrote (an older folder of that name is replaced only
then), read through the safe reader (no code from the files) into copies, so that a failed read changes
nothing. Accelerate's ``save_fsdp_model`` / ``load_fsdp_model`` / ``*_fsdp_optimizer`` use it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from overdrive.checkpoint import naming
from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import Group, run_dcp
from overdrive.checkpoint.storage import SafeFileSystemReader, SafeLoadPlanner


def save_folder(state: dict[str, Any], target: str | os.PathLike, what: str = "save") -> Path:
    """Write ``state`` (tensors or DTensors, each rank its shards) to the DCP folder ``target``; call on every
    process. Until every rank has written, ``target`` is untouched (an older folder stays as it was)."""
    group = Group()
    group.arrive(what)
    target = Path(target).absolute()
    token = group.broadcast(uuid.uuid4().hex[:12] if group.rank == 0 else None)
    temporary = naming.temporary_path(target, token)
    group.run_on_main(lambda: naming.claim(temporary, token), what)
    error: BaseException | None = None
    try:
        flat = _flatten(state)
        planner = dcp.DefaultSavePlanner(flatten_state_dict=False)  # flat already: lists stay one value
        run_dcp(lambda: dcp.save(flat, storage_writer=dcp.FileSystemWriter(str(temporary)), planner=planner))
    except Exception as exc:  # noqa: BLE001 - every rank hears of it below
        error = exc
    try:
        group.check(error, f"{what} to {target}")
    except Exception:
        if group.rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)
        raise

    def finish() -> None:
        naming.release(temporary)
        naming.publish(temporary, target, token)

    group.run_on_main(finish, what)
    return target


def load_folder(state: dict[str, Any], folder: str | os.PathLike, allow_pickle: bool = False,
                what: str = "load") -> dict[str, Any]:
    """A copy of ``state`` (same keys, shapes and shardings) filled from the DCP folder ``folder``;
    ``state``'s own tensors are not touched, so a read that fails midway leaves the caller's objects as
    they were. Call on every process."""
    group = Group()
    group.arrive(what)
    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"{what}: {folder} is not a checkpoint folder (no .metadata); nothing was changed")
    copy = {key: value.detach().clone() if isinstance(value, torch.Tensor) else value
            for key, value in _flatten(state).items()}
    error: BaseException | None = None
    try:
        run_dcp(lambda: dcp.load(copy, storage_reader=SafeFileSystemReader(folder, allow_pickle=allow_pickle),
                                 planner=SafeLoadPlanner(allow_pickle=allow_pickle)))
    except Exception as exc:  # noqa: BLE001 - every rank hears of it below
        error = exc
    group.check(error, f"{what} from {folder} (nothing was changed)")
    return _fill(state, copy)


def _flatten(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one flat dict of dotted keys (``{"model": {"w": t}}`` -> ``{"model.w": t}``: the keys
    DCP's own flattening gives, so Accelerate's folders keep their layout); other values are leaves."""
    flat: dict[str, Any] = {}
    for key, value in state.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _fill(template: dict[str, Any], flat: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``template``'s nesting with the values of ``flat`` (keys may hold dots: the template decides)."""
    return {key: _fill(value, flat, f"{prefix}{key}.") if isinstance(value, dict) and value
            else flat[f"{prefix}{key}"] for key, value in template.items()}
