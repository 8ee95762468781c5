"""``save_state``: every piece of a training run, published by one atomic rename.

By default the folder holds Accelerate's files (``accelerate_layout.py``) and overdrive's small extras:
``state.json`` (counters, data-loader positions), ``rank_<r>.json`` (each rank's RNG states) and
``manifest.json``. With ``layout="resharding"`` (or an async save) the models, optimizers and every other
tensor are written with DCP instead, and the folder holds:

- ``__<rank>_0.distcp`` and ``.metadata``: DCP's files. Models, optimizers and the tensors of the other
  pieces; each rank writes its own part (replicated tensors once, spread over the ranks).
- ``state.json`` (rank 0): schedulers, the loss scaler, data-loader positions, registered objects,
  step counters; tensors inside them are references into the DCP files.
- ``rank_<r>.json``: the RNG states of rank ``r``.
- ``manifest.json``, written last: format version, world size, versions, and every file's size and CRC-32.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.tensor import DTensor

from overdrive.checkpoint import background, naming, space
from overdrive.checkpoint.accelerate_layout import tensors_written, write_accelerate_files
from overdrive.checkpoint.codec import encode
from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import Group, run_dcp
from overdrive.checkpoint.state import ModelState, OptimizerState, capture_rng, loader_record, optimizer_owner
from overdrive.checkpoint.storage import (
    DCP_METADATA,
    MANIFEST,
    describe,
    describe_many,
    manifest_data,
    read_json,
    write_json,
)
from overdrive.checkpoint.writer import ChecksummingWriter
from overdrive.runtime.group import rank
from overdrive.training.prepared import TrainingState

STATE_FILE = "state.json"
#: ``save_state(layout=...)``: Accelerate's files (the default), or overdrive's DCP layout that loads at
#: any number of processes
LAYOUTS = ("accelerate", "resharding")


def rank_file(rank: int) -> str:
    """The name of the per-rank JSON file (RNG, loader positions) that rank ``rank`` writes."""
    return f"rank_{rank}.json"


_T = TypeVar("_T")

#: DCP writer threads per process: the write of one file overlaps the serialization of the next.
WRITER_THREADS = 2


def save_state(run: TrainingState, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
               async_save: bool | None = None, layout: str | None = None, accelerate_layout: bool | None = None,
               **unexpected: Any) -> str:
    """Save every piece of ``run`` (the Accelerator's training state) into ``output_dir``; return the folder.

    Call it on every process, or on the main process only when it holds the whole state (one process or
    DDP, as Accelerate allows). ``layout``: ``"accelerate"`` (the default: Accelerate's files) or
    ``"resharding"`` (DCP; also what an async save writes); ``accelerate_layout=True`` / ``False`` is the
    older spelling of the two. See :meth:`overdrive.Accelerator.save_state`.
    """
    if unexpected:
        raise TypeError(f"save_state() got unexpected arguments {sorted(unexpected)}")
    # With nothing prepared the checkpoint still holds the random states, as Accelerate's does
    project = run.project
    if async_save is None:
        async_save = bool(getattr(project, "async_save", False))
    layout = _resolve_layout(layout, accelerate_layout, async_save, _needs_resharding(run))
    background.wait_for_pending_save()  # the previous async save is published first
    group = _saving_group(run)
    target_name, token = group.run_on_main(
        lambda: (str(naming.save_target(project, output_dir)), uuid.uuid4().hex[:16]), "save_state")
    target = Path(target_name)
    if run.window.position:
        _warn_mid_window(run.window.position, run.window.size)

    temporary = naming.temporary_path(target, token)
    where = f"save_state({str(target)!r})"
    leader, needed = False, 0
    try:
        leader, replicate = _prepare_folder(run, group, temporary, token)
        # hooks write into the folder being built, so what they write is published with it
        kept = _on_every_rank(group, f"{where}: a save_state pre-hook failed",
                              lambda: _run_save_hooks(run, temporary), [])
        kept = group.broadcast(kept)  # the main process's choice
        if layout == "accelerate":  # a full disk is found before Accelerate's files are written
            needed = _on_every_rank(group, where,
                                    lambda: space.check_space(temporary, tensors_written(run, group.rank)), 0)
        flat, summary = _on_every_rank(
            group, f"{where} could not collect the training state",
            lambda: _write_json_parts(run, group, temporary, kept,
                                      safe_serialization if layout == "accelerate" else None), ({}, {}))
        _save_engine(run, group, temporary, layout == "accelerate", where)
        if layout == "resharding":  # a full disk is found here, before the large writes
            needed = _on_every_rank(group, where, lambda: space.check_space(temporary, flat), 0)
        writer = ChecksummingWriter(temporary, WRITER_THREADS)  # the data files' CRC-32s come with the write
        planner = DefaultSavePlanner(flatten_state_dict=False)

        def publish(over: Group, metadata: Any) -> None:
            everything = over.gather(_describe_own_files(over, temporary, metadata, writer.checksums))
            over.run_on_main(lambda: _finish(run, over, temporary, target, token, everything, summary),
                             f"{where} could not publish the checkpoint")
            if replicate:
                _replicate(run, over, temporary if leader and over.rank != 0 else None, target, token)

        if async_save:
            background.start(flat, writer, planner, group, target, temporary, leader, needed, publish)
            project.iteration += 1
            return str(target)
        metadata = None
        if layout == "resharding":
            metadata = run_dcp(lambda: dcp.save(flat, storage_writer=writer, planner=planner,
                                                no_dist=not group.active), writes=(temporary, needed))
        publish(group, metadata)
    except BaseException as exc:
        if leader:
            shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, CheckpointError):
            raise _unfinished(exc, where, temporary, needed) from exc
        raise
    project.iteration += 1
    return str(target)


def _saving_group(run: TrainingState) -> Group:
    """The processes that save: every process, or the main process alone when only it called ``save_state``
    and it holds the whole state."""
    group = Group()
    try:
        group.arrive("save_state")  # before any collective
    except CheckpointError as exc:
        if "did not arrive" in str(exc) or not _can_save_alone(run, group):
            raise  # a rank late past the timeout may still come: saving alone would not meet it
        # `if accelerator.is_main_process: accelerator.save_state(...)` (diffusers' examples): Accelerate runs it
        # under DDP, where the main process holds the whole state; so does overdrive, writing the folder of a
        # one-process run (the other ranks' RNG states are not saved; load_state leaves theirs as they are)
        group = Group.alone()
    return group


def _on_every_rank(group: Group, what: str, step: Callable[[], _T], failed: _T) -> _T:
    """Run one step of the save; a failure on any rank is raised on every rank (``what`` failed), so no rank
    is left waiting in the next collective."""
    error, result = None, failed
    try:
        result = step()
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    group.check(error, what)
    return result


def _save_engine(run: TrainingState, group: Group, temporary: Path, accelerate: bool, where: str) -> None:
    """The DeepSpeed engine's own files, inside the temporary folder so that the manifest covers them."""
    engine = engine_of(run)
    if engine is not None:
        _on_every_rank(group, f"{where}: the engine could not save its state",
                       lambda: engine.save(temporary, list(run.objects.models), accelerate=accelerate), None)


def _unfinished(exc: Exception, where: str, temporary: Path, needed: int) -> CheckpointError:
    """The error a save that stopped part-way raises: a full disk says how much room it needs; anything else
    (typically a collective that failed because another process died mid-save) that nothing was published."""
    if space.is_disk_full(exc):
        return CheckpointError(f"{where}: " + space.disk_full_message(temporary.parent, needed))
    return CheckpointError(f"{where} did not finish ({type(exc).__name__}: {exc}); "
                           "nothing was published and earlier checkpoints are untouched")


_warned_mid_window = [False]  # per process: the warning below is said once per run


def _warn_mid_window(position: int, size: int) -> None:
    """Say once per run, from the main process, that a save in the middle of a window loses its gradients (a
    loop that saves every N micro-batches would otherwise repeat it at every save, on every rank)."""
    if _warned_mid_window[0] or rank() != 0:
        return
    _warned_mid_window[0] = True
    warnings.warn(
        f"save_state() in the middle of an accumulation window (micro-batch {position} of {size}): the gradients "
        "accumulated so far are not saved, so a resumed run starts this window without them. Save after an "
        "optimizer step (when accelerator.sync_gradients is True) for an exact resume (said once per run)",
        stacklevel=4)


def _needs_resharding(run: TrainingState) -> bool:
    """Whether a prepared model can only be stored in the resharding layout: a model that says so
    (``checkpoint_layout = "resharding"``: a pipeline stage, which Accelerate's files cannot hold)."""
    return any(getattr(model, "checkpoint_layout", None) == "resharding" for model in run.objects.models)


def _resolve_layout(layout: str | None, accelerate_layout: bool | None, async_save: bool,
                    needs_resharding: bool = False) -> str:
    """The layout a save writes: ``layout``, else ``accelerate_layout``'s, else Accelerate's (DCP's when the
    save runs in the background, which only DCP's writer does, or when a model needs it)."""
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"save_state(layout={layout!r}): the layout must be one of {', '.join(map(repr, LAYOUTS))}")
    older = None if accelerate_layout is None else ("accelerate" if accelerate_layout else "resharding")
    if layout is not None and older is not None and layout != older:
        raise ValueError(f"save_state(layout={layout!r}, accelerate_layout={accelerate_layout!r}) contradict each "
                         "other; pass layout alone")
    chosen = layout or older or ("resharding" if async_save or needs_resharding else "accelerate")
    if chosen == "accelerate" and needs_resharding:
        raise ValueError("save_state(layout='accelerate'): a prepared model is a pipeline stage on each rank, which "
                         "Accelerate's files cannot hold; pass layout='resharding' (the default for it)")
    if chosen == "accelerate" and async_save:
        raise ValueError("save_state(async_save=True) writes the resharding layout (DCP writes in the background); "
                         "pass layout='resharding', or async_save=False for Accelerate's files")
    return chosen


def _can_save_alone(run: TrainingState, group: Group) -> bool:
    """Whether the main process holds the whole training state (one process, or DDP: no engine, no sharded
    parameter), so that it can save without the other processes."""
    if group.rank != 0 or run.engine is not None:
        return False
    return not any(isinstance(p, DTensor) for model in run.objects.models for p in model.parameters())


def _run_save_hooks(run: TrainingState, folder: Path) -> list[int]:
    """Run the save pre-hooks with the folder being written; return the indices of the models still to
    save (hooks that save a model themselves pop its entry from ``weights``)."""
    hooks = list(run.objects.save_hooks.values())
    if not hooks:
        return list(range(len(run.objects.models)))
    models = run.hook_models()
    weights = [run.unwrap_model(model).state_dict() for model in run.objects.models]
    original = list(weights)
    for hook in hooks:
        hook(models, weights, str(folder))
    return [i for i, w in enumerate(original) if any(w is other for other in weights)]


def _prepare_folder(run: TrainingState, group: Group, temporary: Path, token: str) -> tuple[bool, bool]:
    """Create the temporary folder. Return whether this rank does the file-system steps, and whether
    the finished checkpoint must be copied to other machines.

    The file-system steps are rank 0's, or with ``save_on_each_node`` each machine's first process's,
    unless the folder turns out to be on a file system that every machine shares.
    """
    project = run.project
    local_main = run.local_process_index == 0
    if not (project.save_on_each_node and group.active):
        if group.rank == 0:
            naming.clean_temporaries(temporary.parent, token, _cleaned_name(project, temporary))
            naming.claim(temporary, token)
        group.barrier()
        return group.rank == 0, False
    marker = temporary / f".node-{group.rank}"
    if local_main:
        naming.clean_temporaries(temporary.parent, token, _cleaned_name(project, temporary))
        naming.claim(temporary, token)
        marker.touch()
    mains = [rank for rank, flag in enumerate(group.gather(local_main)) if flag]
    shared = group.broadcast(all((temporary / f".node-{r}").exists() for r in mains) if group.rank == 0 else None)
    group.barrier()
    if local_main:
        marker.unlink(missing_ok=True)
    return (group.rank == 0, False) if shared else (local_main, True)


def _cleaned_name(project: Any, temporary: Path) -> str | None:
    """Whose leftovers a save may clean: any checkpoint's in the project's own checkpoints folder
    (automatic naming), else only those of the checkpoint it writes (the parent may hold other jobs')."""
    return None if project.automatic_checkpoint_naming else temporary.name[1:].rsplit(".tmp-", 1)[0]


def engine_of(run: TrainingState) -> Any:
    """The strategy's engine checkpoint (DeepSpeed), which saves the objects it ``owns`` itself; or None."""
    return run.engine


def _write_json_parts(run: TrainingState, group: Group, folder: Path, kept: list[int],
                      accelerate_safe: bool | None = None) -> tuple[dict, dict]:
    """Write ``rank_<r>.json`` (and ``state.json`` on rank 0); return DCP's flat state dict and a summary.
    ``accelerate_safe`` not None: the Accelerate layout (safetensors weights when True): Accelerate's files
    hold the models, optimizers, schedulers, scaler and registered objects, and DCP gets nothing.

    The JSON files are fsync'ed later, when the manifest describes them (in the background for an async
    save: the training loop does not wait for the disk)."""
    engine = engine_of(run)
    owned = engine.owns if engine is not None else lambda obj: False
    accelerate = accelerate_safe is not None
    flat: dict[str, Any] = {}
    rng = capture_rng(run.device)
    if accelerate:  # the hook-saved models are skipped, as in Accelerate
        write_accelerate_files(run, folder, group.rank, group.active, kept, rng, bool(accelerate_safe))
    kept = [i for i in kept if not owned(run.objects.models[i])]
    model_keys, optimizers = ([], [{"engine": owned(o)} for o in run.objects.optimizers]) if accelerate \
        else _resharding_parts(run, kept, owned, flat)
    generators = [getattr(loader, "generator", None) for loader in run.objects.dataloaders]
    write_json(folder / rank_file(group.rank), {
        "rank": group.rank, "rng": encode(rng),
        "loader_generators": [None if g is None else encode(g.get_state()) for g in generators]}, sync=False)
    summary = {"models": kept, "optimizers": len(optimizers), "schedulers": len(run.objects.schedulers),
               "dataloaders": len(run.objects.dataloaders), "custom_objects": len(run.objects.custom_objects),
               "scaler": run.scaler is not None, "step": run.window.step,
               "iteration": run.project.iteration, "layout": "accelerate" if accelerate else "resharding"}
    if group.rank != 0:
        return flat, summary

    def sink(prefix: str) -> Any:
        def store(tensor: torch.Tensor, path: str) -> str:
            key = f"{prefix}.{path}"
            flat[key] = tensor.detach()
            return key
        return store

    pickled: list[str] = []
    custom = [None if accelerate else encode(obj.state_dict(), sink(f"custom_{i}"), f"custom_{i}", pickled)
              for i, obj in enumerate(run.objects.custom_objects)]
    schedulers = [None if owned(s) or accelerate else encode(s.state_dict(), sink(f"scheduler_{i}"),
                                                               f"scheduler_{i}", pickled)
                  for i, s in enumerate(run.objects.schedulers)]
    if pickled:
        warnings.warn(f"save_state(): {', '.join(pickled)} could only be saved with pickle; load_state() will need "
                      "allow_pickle=True to read them back", stacklevel=4)
    scaler_state = run.scaler.state_dict() if run.scaler is not None and not accelerate else None
    write_json(folder / STATE_FILE, {
        "layout": summary["layout"], "counters": run.counters,
        "models": kept, "model_keys": model_keys, "optimizers": optimizers, "schedulers": schedulers,
        "scaler": encode(scaler_state) if scaler_state else None,
        "dataloaders": [encode(loader_record(loader)) for loader in run.objects.dataloaders],
        "custom_objects": custom}, sync=False)
    return flat, summary


def _resharding_parts(run: TrainingState, kept: list[int], owned: Any,
                      flat: dict[str, Any]) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """Put the models' and optimizers' tensors into DCP's ``flat`` dict; return each model's keys and what
    ``state.json`` records of each optimizer."""
    model_keys = []
    for i in kept:
        state = ModelState(run.objects.models[i]).state_dict()
        flat.update({f"model_{i}.{k}": v for k, v in state.items()})
        model_keys.append(list(state))
    optimizers: list[dict[str, Any]] = []
    for j, prepared in enumerate(run.objects.optimizers):
        if owned(prepared):
            optimizers.append({"has_state": False, "engine": True})
            continue
        inner = getattr(prepared, "optimizer", prepared)
        adapter = OptimizerState(inner, optimizer_owner(inner, run.objects.models))
        if adapter.has_state:
            flat.update({f"optimizer_{j}.{k}": v for k, v in adapter.state_dict().items()})
            optimizers.append({"has_state": True})
        else:  # hyperparameters only (a scheduler may have changed them); no state to shard
            optimizers.append({"has_state": False, "param_groups": encode(inner.state_dict()["param_groups"])})
    return model_keys, optimizers


def _describe_own_files(group: Group, folder: Path, metadata: Any,
                        written: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Size and checksum of the files this rank wrote (rank 0 also DCP's metadata and state.json); those of
    the data files come from the writer (``written``), which computed them on the way out."""
    data_files = [] if metadata is None else sorted({info.relative_path for info in metadata.storage_data.values()})
    names = [name for name in data_files if name.startswith(f"__{group.rank}_")] + [rank_file(group.rank)]
    if group.rank == 0:
        names += [STATE_FILE] if metadata is None else [DCP_METADATA, STATE_FILE]
    known = {name: {**written[name], "rank": group.rank} for name in names if name in written}
    return {**known, **describe_many(folder, [name for name in names if name not in known], group.rank)}


def _finish(run: TrainingState, group: Group, temporary: Path, target: Path, token: str,
            everything: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """On rank 0: write the manifest, rename the folder into place, apply ``total_limit``."""
    naming.release(temporary)  # complete: the owner file is not part of the checkpoint
    files: dict[str, Any] = {}
    for part in everything:
        files.update(part)
    for path in sorted(temporary.rglob("*")):  # what save hooks wrote
        name = path.relative_to(temporary).as_posix()
        if path.is_file() and name not in files:
            files[name] = {**describe(temporary, name, 0), "rank": None}
    write_json(temporary / MANIFEST, manifest_data(files, group.size, summary))
    target.parent.mkdir(parents=True, exist_ok=True)
    naming.publish(temporary, target, token)
    project = run.project
    if project.automatic_checkpoint_naming:
        naming.prune(target.parent, project.total_limit, keep=target)


def _main_files(folder: Path) -> list[str]:
    """The files of a published checkpoint that rank 0 (or a save hook) wrote, DCP's data files aside: what
    the other machines' copies need from it."""
    files = read_json(folder / MANIFEST)["files"]
    return [*(name for name, entry in files.items() if entry.get("rank") in (0, None)
              and not Path(name).name.startswith("__")), MANIFEST]


def _replicate(run: TrainingState, group: Group, temporary: Path | None, target: Path, token: str) -> None:
    """``save_on_each_node`` on machines that do not share the folder: rank 0 sends its global files to
    every machine's first process, which publishes that machine's copy (``temporary`` is ``None`` on the
    other ranks). A collective: every rank calls it."""
    payload = group.broadcast({name: (target / name).read_bytes() for name in _main_files(target)}
                              if group.rank == 0 else None)
    error = None
    if temporary is not None:
        try:
            for name, data in payload.items():
                (temporary / name).parent.mkdir(parents=True, exist_ok=True)
                with open(temporary / name, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            naming.release(temporary)
            naming.publish(temporary, target, token)
            project = run.project
            if project.automatic_checkpoint_naming:
                naming.prune(target.parent, project.total_limit, keep=target)
        except Exception as exc:  # noqa: BLE001 - reported on every rank
            error = exc
    group.check(error, f"save_state({str(target)!r}) could not publish a machine's copy")
