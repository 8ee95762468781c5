"""``load_state``: check a checkpoint whole and fitting, then restore every piece of the training run.

Before anything is changed, the files are checked against the manifest (split over the ranks) and the
checkpoint's keys and shapes against this run's models and optimizers, so a damaged or mismatched
checkpoint fails with one error that names the files or keys, on every rank, leaving the run untouched.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from overdrive.checkpoint import naming
from overdrive.checkpoint.accelerate_format import is_accelerate_checkpoint, load_into
from overdrive.checkpoint.background import wait_for_pending_save
from overdrive.checkpoint.codec import REF, decode
from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import Group, run_dcp
from overdrive.checkpoint.rollback import Pieces, Snapshot
from overdrive.checkpoint.save import STATE_FILE, engine_of, rank_file
from overdrive.checkpoint.state import (
    GROUPS,
    STATE,
    ModelState,
    OptimizerState,
    flatten_optimizer,
    loader_state_for,
    optimizer_owner,
    restore_rng,
    restores_position,
)
from overdrive.checkpoint.storage import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    read_json,
    read_manifest,
    verify_files,
)
from overdrive.training.prepared import TrainingState


def load_state(run: TrainingState, input_dir: str | os.PathLike | None = None, *, allow_pickle: bool | None = None,
               strict: bool = True, verify: bool = True, load_kwargs: dict[str, Any] | None = None,
               **unexpected: Any) -> str:
    """Restore what :func:`~overdrive.checkpoint.save.save_state` saved; return the folder.

    Call it on every process. ``allow_pickle``: None (the default) reads Accelerate's files as Accelerate
    does and unpickles nothing of overdrive's own; True unpickles anything; False nothing beyond plain values.
    See :meth:`overdrive.Accelerator.load_state`.
    """
    if unexpected:
        raise TypeError(f"load_state() got unexpected arguments {sorted(unexpected)}; it accepts allow_pickle, "
                        "strict, verify and load_kwargs")

    wait_for_pending_save()  # a checkpoint being written in the background is published first
    group = Group()
    group.arrive("load_state")  # before any collective
    project = run.project
    folder = Path(group.run_on_main(lambda: str(_find(project, input_dir)), "load_state"))
    if is_accelerate_checkpoint(folder):  # written by Accelerate's save_state: read its files as they are
        _load_plain_accelerate(run, folder, group, allow_pickle, strict, load_kwargs)
        return str(folder)
    error, manifest = None, {}
    try:
        manifest = read_manifest(folder)
        names = sorted(manifest["files"])
        problems = verify_files(folder, manifest, names[group.rank::group.size], with_checksums=verify)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error, problems = exc, []
    group.check(error, f"load_state({str(folder)!r})")
    problems = [p for part in group.gather(problems) for p in part]
    if problems:
        raise CheckpointError(f"checkpoint {folder} is damaged:\n  " + "\n  ".join(problems))
    if manifest.get("contents", {}).get("layout") == "accelerate":
        _load_accelerate_layout(run, folder, group, manifest, allow_pickle, strict, load_kwargs)
        return str(folder)
    allow_pickle = bool(allow_pickle)

    error, reading = None, None
    try:
        reading = _read_and_check(run, folder, group, strict, allow_pickle)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    group.check(error, f"load_state({str(folder)!r})")
    assert reading is not None  # group.check raised the error otherwise
    state, engine, reader, plan, loader_states, decoded = reading
    plan.raise_unexpected(group)

    # From here on, a failure on any rank puts back what was changed (the snapshot); the model and optimizer
    # tensors are read in place last, once everything else is in.
    snapshot = Snapshot(Pieces(run))
    planner = lambda: SafeLoadPlanner(allow_pickle)  # noqa: E731 - one planner per read
    objects, tensors = plan.split_targets()
    if objects:  # the same on every rank (state.json is rank 0's); only tensors, filled in place
        run_dcp(lambda: dcp.load(objects, storage_reader=reader, planner=planner(), no_dist=not group.active))
    error = None
    try:
        plan.apply_objects(run, decoded)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    _check_or_restore(group, error, snapshot, f"load_state({str(folder)!r}) could not restore the training state",
                      process_state=False)
    try:
        run_dcp(lambda: dcp.load(tensors, storage_reader=reader, planner=planner(), no_dist=not group.active))
        plan.targets.update(tensors)  # values that are not tensors were replaced in that dict, not filled in
    except BaseException:
        snapshot.restore(process_state=False)
        raise
    error = None
    try:
        if engine is not None:
            engine.load(folder, list(run.objects.models), allow_pickle=allow_pickle)
        plan.apply_tensors(run, state)
        _restore_process_state(run, state, decoded, loader_states, manifest, group)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    _check_or_restore(group, error, snapshot, f"load_state({str(folder)!r}) could not restore the training state")
    return str(folder)


def _load_plain_accelerate(run: TrainingState, folder: Path, group: Group, allow_pickle: bool | None, strict: bool,
                           load_kwargs: dict[str, Any] | None) -> None:
    """A folder the real Accelerate wrote: its files, as its ``load_state`` reads them."""
    error = None
    try:
        load_into(run, folder, allow_pickle=allow_pickle, strict=strict, load_kwargs=load_kwargs,
                  distributed=group.active)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    group.check(error, f"load_state({str(folder)!r})")


def _load_accelerate_layout(run: TrainingState, folder: Path, group: Group, manifest: dict[str, Any],
                            allow_pickle: bool | None, strict: bool, load_kwargs: dict[str, Any] | None) -> None:
    """A verified folder in Accelerate's layout that overdrive wrote: Accelerate's files, then overdrive's
    extras (the accumulation window, the data positions with ``exact_resume``, every RNG stream)."""
    error, extras = None, None
    try:  # everything of overdrive's is read and decoded before anything changes
        state = read_json(folder / STATE_FILE)
        mine = folder / rank_file(group.rank)
        ranked = read_json(mine) if mine.is_file() else None
        _check_counts(run, state)
        loader_states = [loader_state_for(decode(record), loader, i) if restores_position(loader) else None
                         for i, (record, loader) in enumerate(zip(state["dataloaders"], run.objects.dataloaders))]
        generators = [None if g is None else decode(g) for g in (ranked or {}).get("loader_generators", [])]
        rng = decode(ranked["rng"], allow_pickle=bool(allow_pickle)) if ranked is not None else None
        extras = (state, loader_states, {"generators": generators, "rng": rng})
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    group.check(error, f"load_state({str(folder)!r})")
    assert extras is not None  # group.check raised the error otherwise
    _load_plain_accelerate(run, folder, group, allow_pickle, strict, load_kwargs)
    state, loader_states, decoded = extras
    error = None
    try:
        _restore_process_state(run, state, decoded, loader_states, manifest, group)
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        error = exc
    group.check(error, f"load_state({str(folder)!r}) could not restore the training state")


def _check_counts(run: TrainingState, state: dict[str, Any]) -> None:
    problems = _count_problems(run, state)
    if problems:
        raise CheckpointError("\n".join(problems))


class _Reading(NamedTuple):
    """What ``load_state`` reads and checks before it changes anything."""

    state: dict[str, Any]
    engine: Any
    reader: SafeFileSystemReader
    plan: _Plan
    loader_states: list[dict[str, Any] | None]
    decoded: dict[str, Any]


def _read_and_check(run: TrainingState, folder: Path, group: Group, strict: bool,
                    allow_pickle: bool) -> _Reading:
    state = read_json(folder / STATE_FILE)
    mine = folder / rank_file(group.rank)
    ranked = read_json(mine) if mine.is_file() else None
    given = run.hook_models()
    models = list(given)
    for hook in run.objects.load_hooks.values():
        hook(models, str(folder))  # a hook that loads a model itself pops it
    engine = engine_of(run)
    wanted = [i for i, (model, seen) in enumerate(zip(run.objects.models, given)) if any(seen is m for m in models)
              and not (engine is not None and engine.owns(model))]
    reader = SafeFileSystemReader(folder, allow_pickle=allow_pickle)
    plan = _Plan(reader.read_metadata(), folder, strict)
    plan.problems += _count_problems(run, state)
    plan.add_models(run, state, wanted)
    plan.add_optimizers(run, state)
    plan.add_references(state)
    plan.raise_problems()
    # As Accelerate, a loader's position is restored only when it asked for it (exact_resume / stateful):
    # otherwise the script skips the batches it already trained on.
    loader_states = [loader_state_for(decode(record), loader, i) if restores_position(loader) else None
                     for i, (record, loader) in enumerate(zip(state["dataloaders"], run.objects.dataloaders))]
    # Everything is decoded before anything changes: a value refused here (a set without allow_pickle,
    # a damaged record) leaves the run as it was. Tensors referred to are filled by the reads below.
    decoded = plan.decode_objects(run, state, ranked, allow_pickle)
    return _Reading(state, engine, reader, plan, loader_states, decoded)


def _check_or_restore(group: Group, error: BaseException | None, snapshot: Snapshot, what: str,
                      process_state: bool = True) -> None:
    """``group.check``, putting the snapshot back first on every rank when any rank failed."""
    try:
        group.check(error, what)
    except BaseException:
        snapshot.restore(process_state)
        raise


def _find(project: Any, input_dir: str | os.PathLike | None) -> Path:
    if input_dir is None:
        if not project.automatic_checkpoint_naming:
            raise ValueError("load_state() needs input_dir, unless ProjectConfiguration(automatic_checkpoint_naming="
                             "True) names the checkpoints (then it loads the newest complete one)")
        return naming.newest_checkpoint(project)
    folder = Path(input_dir)
    if folder.is_file():
        raise CheckpointError(f"load_state({str(folder)!r}): that path is a file, not a checkpoint folder; give the "
                              f"folder save_state() wrote (it holds manifest.json){_sibling_hint(folder)}")
    if not folder.exists():
        raise CheckpointError(f"checkpoint folder {folder} does not exist{naming.explain_missing(folder)}")
    return folder


def _sibling_hint(path: Path) -> str:
    parent = path.parent
    return f", e.g. {parent}" if (parent / "manifest.json").is_file() else ""


def _count_problems(run: TrainingState, state: dict[str, Any]) -> list[str]:
    pairs = [("optimizers", run.objects.optimizers), ("schedulers", run.objects.schedulers),
             ("dataloaders", run.objects.dataloaders), ("custom_objects", run.objects.custom_objects)]
    wrong = [f"{len(state[key])} {key.replace('_', ' ')} (this run has {len(ours)})"
             for key, ours in pairs if len(state[key]) != len(ours)]
    extra = [i for i in state["models"] if i >= len(run.objects.models)]
    if extra:
        wrong.insert(0, f"model {extra[0]} (this run has {len(run.objects.models)} models)")
    if not wrong:
        return []
    return [f"the checkpoint holds {', '.join(wrong)}; prepare (and register_for_checkpointing) the same objects, "
            "in the same order, as the run that saved it"]


class _Plan:
    """What to read from the DCP files, into which tensors, and what does not fit."""

    def __init__(self, metadata: Metadata, folder: Path, strict: bool) -> None:
        self.saved = metadata.state_dict_metadata
        self.folder = folder
        self.strict = strict
        self.targets: dict[str, Any] = {}
        self.problems: list[str] = []
        self.groups: dict[int, list[dict[str, Any]]] = {}
        self.unexpected: dict[str, list[str]] = {}

    def _keys(self, prefix: str) -> dict[str, Any]:
        return {k[len(prefix):]: v for k, v in self.saved.items() if k.startswith(prefix)}

    def _allocate(self, key: str) -> torch.Tensor:
        entry = self.saved[key]
        if not isinstance(entry, TensorStorageMetadata):  # a reference to bytes: written by other code
            raise CheckpointError(f"{key}: the checkpoint saved bytes under this key where a tensor is "
                                  f"referenced in {STATE_FILE}; it was not written by save_state or is damaged")
        return torch.empty(entry.size, dtype=entry.properties.dtype)

    def _compare(self, what: str, prefix: str, target: dict[str, Any], strict: bool,
                 optional: tuple[str, ...] = ()) -> None:
        """Queue ``target``'s keys that the checkpoint holds; record missing, unexpected and reshaped ones."""
        saved = self._keys(prefix)
        missing = [k for k in target if k not in saved and not k.startswith(optional)]
        unexpected = [k for k in saved if k not in target]
        reshaped = [f"{k} (checkpoint {tuple(saved[k].size)}, this run {tuple(v.shape)})"
                    for k, v in target.items() if k in saved and isinstance(v, torch.Tensor)
                    and isinstance(saved[k], TensorStorageMetadata) and tuple(saved[k].size) != tuple(v.shape)]
        if strict and missing:
            self.problems.append(f"{what}: missing in the checkpoint: {_names(missing)}")
        if strict and unexpected:  # judged over every rank: a pipeline rank holds only its stages' keys
            self.unexpected[what] = unexpected
        if reshaped:
            self.problems.append(f"{what}: shapes differ: {_names(reshaped)}")
        for key, value in target.items():
            if key in saved:
                self.targets[prefix + key] = value

    def add_models(self, run: TrainingState, state: dict[str, Any], wanted: list[int]) -> None:
        saved_models = list(state["models"])
        for i in wanted:
            if i not in saved_models:
                self.problems.append(f"model {i}: the checkpoint has no weights for it (it holds models "
                                     f"{saved_models}); a save hook may have saved it in its own format")
                continue
            target = ModelState(run.objects.models[i]).state_dict()
            self._compare(f"model {i} ({type(run.unwrap_model(run.objects.models[i])).__name__})",
                          f"model_{i}.", target, self.strict)

    def add_optimizers(self, run: TrainingState, state: dict[str, Any]) -> None:
        for j, prepared in enumerate(run.objects.optimizers):
            if j >= len(state["optimizers"]) or not state["optimizers"][j]["has_state"]:
                continue
            inner = getattr(prepared, "optimizer", prepared)
            nested = OptimizerState(inner, optimizer_owner(inner, run.objects.models)).nested_state_dict()
            self.groups[j] = nested[GROUPS]
            prefix = f"optimizer_{j}."
            target = flatten_optimizer(nested)
            # State saved for parameters that have none here (their gradients existed before this load, so
            # torch did not create it): read into new tensors. State this run has but the checkpoint lacks
            # (parameters that had not stepped when saved) is left out, so they stay without state.
            for key, entry in self._keys(prefix).items():
                if key.startswith(f"{STATE}.") and key not in target:
                    target[key] = self._allocate(prefix + key) if isinstance(entry, TensorStorageMetadata) else None
            self._compare(f"optimizer {j} ({type(inner).__name__})", prefix, target, strict=True,
                          optional=(f"{STATE}.",))

    def add_references(self, state: dict[str, Any]) -> None:
        """Tensors of schedulers and registered objects: read into new tensors shaped as saved."""
        for key in _references(state.get("schedulers", [])) + _references(state.get("custom_objects", [])):
            if key not in self.saved:
                self.problems.append(f"{key}: referenced by {STATE_FILE} but missing from the DCP files")
            else:
                self.targets[key] = self._allocate(key)

    def raise_unexpected(self, group: Group) -> None:
        """Fail on checkpoint keys that no rank of this run loads (a collective)."""
        seen = group.gather(self.unexpected)
        problems = []
        for what in dict.fromkeys(w for part in seen for w in part):
            everywhere = set.intersection(*(set(part.get(what, ())) for part in seen))
            keys = [k for part in seen for k in part.get(what, ()) if k in everywhere]
            if keys:
                problems.append(f"{what}: in the checkpoint but not in this run: {_names(list(dict.fromkeys(keys)))}")
        if problems:
            raise CheckpointError(f"{self.folder} does not fit this run:\n  " + "\n  ".join(problems))

    def raise_problems(self) -> None:
        if self.problems:
            raise CheckpointError(f"{self.folder} does not fit this run:\n  " + "\n  ".join(self.problems))

    def split_targets(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(fresh tensors of schedulers and registered objects, the model and optimizer targets)."""
        objects = {k: v for k, v in self.targets.items() if k.startswith(("scheduler_", "custom_"))}
        return objects, {k: v for k, v in self.targets.items() if k not in objects}

    def decode_objects(self, run: TrainingState, state: dict[str, Any], ranked: dict[str, Any] | None,
                       allow_pickle: bool) -> dict[str, Any]:
        """Every value of state.json / rank_<r>.json, decoded; tensors are the targets the reads fill."""
        source = self.targets.__getitem__
        schedulers = [None if state["schedulers"][i] is None
                      else decode(state["schedulers"][i], source, allow_pickle, f"scheduler_{i}")
                      for i in range(len(run.objects.schedulers))]
        custom = [decode(state["custom_objects"][i], source, allow_pickle, f"custom_{i}")
                  for i in range(len(run.objects.custom_objects))]
        scaler = decode(state["scaler"]) if state.get("scaler") is not None else None
        generators = [None if g is None else decode(g) for g in (ranked or {}).get("loader_generators", [])]
        rng = decode(ranked["rng"], allow_pickle=allow_pickle) if ranked is not None else None
        return {"schedulers": schedulers, "custom": custom, "scaler": scaler, "generators": generators, "rng": rng,
                "has_scaler": state.get("scaler") is not None}

    def apply_objects(self, run: TrainingState, decoded: dict[str, Any]) -> None:
        """Hand the decoded values to the schedulers, registered objects and the loss scaler."""
        for scheduler, value in zip(run.objects.schedulers, decoded["schedulers"]):
            if value is not None:  # None: restored by the strategy's engine
                scheduler.load_state_dict(value)
        for obj, value in zip(run.objects.custom_objects, decoded["custom"]):
            obj.load_state_dict(value)
        if decoded["has_scaler"]:
            if run.scaler is None:
                warnings.warn("the checkpoint holds fp16 loss-scaler state but this run has no scaler "
                              "(mixed_precision changed?); it is not restored", stacklevel=4)
            else:
                run.scaler.load_state_dict(decoded["scaler"])

    def apply_tensors(self, run: TrainingState, state: dict[str, Any]) -> None:
        """Hand the loaded values to the models and optimizers."""
        for i in state["models"]:
            prefix = f"model_{i}."
            values = {k[len(prefix):]: v for k, v in self.targets.items() if k.startswith(prefix)}
            if values and i < len(run.objects.models):
                ModelState(run.objects.models[i]).load_state_dict(values, strict=self.strict)
        for j, prepared in enumerate(run.objects.optimizers):
            inner = getattr(prepared, "optimizer", prepared)
            info = state["optimizers"][j]
            if info.get("engine"):
                continue  # restored by the strategy's engine
            if not info["has_state"]:
                inner.load_state_dict({"state": {}, "param_groups": decode(info["param_groups"])})
                continue
            prefix = f"optimizer_{j}."
            values = {k[len(prefix):]: v for k, v in self.targets.items() if k.startswith(prefix)}
            OptimizerState(inner, optimizer_owner(inner, run.objects.models)).load_state_dict(values, self.groups[j])


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def _references(encoded: Any) -> list[str]:
    """The DCP keys that encoded JSON refers to."""
    if isinstance(encoded, list):
        return [key for item in encoded for key in _references(item)]
    if isinstance(encoded, dict):
        if set(encoded) == {REF}:
            return [encoded[REF]]
        return [key for value in encoded.values() for key in _references(value)]
    return []


def _restore_process_state(run: TrainingState, state: dict[str, Any], decoded: dict[str, Any],
                           loader_states: list[dict[str, Any] | None], manifest: dict[str, Any], group: Group) -> None:
    """Counters, data-loader positions and, last, this rank's RNG states."""
    counters = state["counters"]
    run.load_counters(counters)
    generators = decoded["generators"]
    for i, (loader, loader_state) in enumerate(zip(run.objects.dataloaders, loader_states)):
        if loader_state is None:
            continue
        loader.load_state_dict(loader_state)
        generator = getattr(loader, "generator", None) if getattr(loader, "exact_resume", False) else None
        if generator is not None and i < len(generators) and generators[i] is not None:
            generator.set_state(generators[i])
    saved_world = int(manifest["world_size"])
    if decoded["rng"] is not None:
        restore_rng(decoded["rng"], run.device)
    elif group.rank == saved_world:  # the first rank without a saved state speaks for all of them
        ranks = (f"rank {saved_world} has" if group.size - saved_world == 1
                 else f"ranks {saved_world}-{group.size - 1} have")
        warnings.warn(f"the checkpoint was saved by {saved_world} processes: {ranks} no saved RNG state and "
                      "keep their current one", stacklevel=4)
