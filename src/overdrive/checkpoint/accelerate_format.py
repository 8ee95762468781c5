"""Read a checkpoint folder written by Hugging Face Accelerate's ``save_state`` (moving a run to overdrive).

Accelerate writes ``model[_i].safetensors`` (or ``pytorch_model[_i].bin``), ``optimizer[_i].bin``,
``scheduler[_i].bin``, ``sampler[_i].bin``, ``dl_state_dict[_i].bin``, ``scaler.pt``,
``random_states_<rank>.pkl`` (with the step count) and ``custom_checkpoint_<i>.pkl``; FSDP2's sharded
``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/`` and DeepSpeed's ``pytorch_model[_i]/`` are folders. All
but the safetensors are ``torch.save`` pickles, read as Accelerate 1.16.0 reads them: with
``torch.load(weights_only=True)`` (tensors, numbers, strings, containers and numpy arrays only), except
``custom_checkpoint_<i>.pkl``, which Accelerate unpickles in full. ``allow_pickle=False`` refuses that one
too unless it holds plain values, ``allow_pickle=True`` unpickles everything; a refused file is not loaded
and is named in the report, as is every file that has no prepared object to go to. Every file is read and
checked before anything is changed, so a refusal leaves the training state as it was (the sharded and
engine folders, read in place, come last).
"""

from __future__ import annotations

import os
import pickle
import random
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from overdrive.checkpoint.accelerate_layout import is_sharded, saved_as_file
from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import run_dcp
from overdrive.checkpoint.storage import MANIFEST, SafeFileSystemReader
from overdrive.runtime.torch_private import set_state_dict_element

_MARKERS = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|optimizer(_\d+)?\.bin|"
                      r"random_states_\d+\.pkl|pytorch_model(_fsdp)?(_\d+)?)$")


def is_accelerate_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` looks like Accelerate's ``save_state`` output (and not overdrive's)."""
    path = Path(folder)

    if not path.is_dir() or (path / MANIFEST).exists():
        return False
    return any(_MARKERS.match(entry.name) for entry in path.iterdir())


@dataclass
class AccelerateCheckpointReport:
    """What ``load_accelerate_checkpoint`` restored, the step it read, and what it could not map."""

    loaded: list[str] = field(default_factory=list)
    not_mapped: list[str] = field(default_factory=list)
    step: int | None = None


def _safe_globals() -> list[Any]:
    """numpy's array rebuilders: RNG states hold numpy arrays; rebuilding one runs no user code."""
    names = []
    core: Any = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core to numpy._core
    for module, attr in ((core.multiarray, "_reconstruct"), (np, "ndarray"), (np, "dtype")):
        if hasattr(module, attr):
            names.append(getattr(module, attr))
    names += [type(np.dtype(kind)) for kind in ("uint32", "int64", "float64")]
    return names


def _load(path: Path, allow_pickle: bool | None, load_kwargs: dict[str, Any]) -> Any:
    kwargs = {"map_location": "cpu", **load_kwargs}
    if allow_pickle is None:  # Accelerate's rule: registered objects in full, the rest weights_only
        allow_pickle = path.name.startswith("custom_checkpoint_") and kwargs.get("weights_only") is not True
    kwargs.pop("weights_only", None)
    if allow_pickle:
        return torch.load(path, weights_only=False, **kwargs)
    with torch.serialization.safe_globals(_safe_globals()):
        return torch.load(path, weights_only=True, **kwargs)


def _indexed(folder: Path, stem: str, suffix: str) -> list[Path]:
    """``stem.suffix``, ``stem_1.suffix``, ... in index order, while they exist."""
    found, index = [], 0
    while True:
        path = folder / (f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}")
        if not path.is_file():
            return found
        found.append(path)
        index += 1


def _read_all(folder: Path, process_index: int, allow_pickle: bool | None, load_kwargs: dict[str, Any],
              refused: list[str]) -> dict[str, Any]:
    """Every file's content by name (safetensors as dicts); refusals recorded in ``refused``."""
    contents: dict[str, Any] = {}
    candidates = [*_indexed(folder, "model", ".safetensors"), *_indexed(folder, "pytorch_model", ".bin"),
                  *_indexed(folder, "optimizer", ".bin"), *_indexed(folder, "scheduler", ".bin"),
                  *_indexed(folder, "sampler", ".bin"), *_indexed(folder, "dl_state_dict", ".bin"),
                  folder / "scaler.pt",
                  folder / f"random_states_{process_index}.pkl"]
    candidates += sorted(folder.glob("custom_checkpoint_*.pkl"), key=lambda p: int(re.findall(r"\d+", p.name)[-1]))
    for path in candidates:
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            contents[path.name] = load_file(str(path))
            continue
        try:
            contents[path.name] = _load(path, allow_pickle, load_kwargs)
        except pickle.UnpicklingError as exc:
            refused.append(f"{path.name}: holds pickled Python objects beyond tensors and plain values ({exc}); "
                           "pass allow_pickle=True to load it, only if you trust where the folder came from")
    return contents


def load_accelerate_checkpoint(folder: str | os.PathLike, *, models: list[Any], optimizers: list[Any],
                               schedulers: list[Any], dataloaders: list[Any], custom_objects: list[Any],
                               scaler: Any = None, process_index: int = 0, allow_pickle: bool | None = None,
                               strict: bool = True, load_kwargs: dict[str, Any] | None = None
                               ) -> AccelerateCheckpointReport:
    """Load an Accelerate ``save_state`` folder into the prepared objects; return what happened.

    Raises ``CheckpointError`` (changing nothing) when a file needs unpickling and ``allow_pickle`` is
    False, or when a model's weights do not fit (with ``strict``)."""
    path = Path(folder)
    refused: list[str] = []
    contents = _read_all(path, process_index, allow_pickle, load_kwargs or {}, refused)
    if refused:
        raise CheckpointError(f"Accelerate checkpoint {path}: nothing was loaded:\n  " + "\n  ".join(refused))
    report = AccelerateCheckpointReport()
    weights = [contents[p.name] for p in (_indexed(path, "model", ".safetensors") or _indexed(path, "pytorch_model", ".bin"))]
    plan = [*_pair("model", weights, models), *_pair("optimizer", _by_stem(contents, "optimizer"), optimizers),
            *_pair("scheduler", _by_stem(contents, "scheduler"), schedulers),
            *_pair("custom_checkpoint", [contents[k] for k in contents if k.startswith("custom_checkpoint_")],
                   custom_objects)]
    for kind, index, value, target in plan:
        if target is None:
            report.not_mapped.append(f"{kind} {index}: the checkpoint has it but nothing of that kind was prepared")
        elif value is None:
            report.not_mapped.append(f"{kind} {index}: prepared, but the checkpoint has none for it (left as it is)")
    plan = [(kind, index, _with_aliases(_unwrap(target), value) if kind == "model" and value is not None
             and target is not None else value, target) for kind, index, value, target in plan]
    if strict:
        _check_models(plan, report)
    for kind, index, value, target in plan:
        if value is None or target is None:
            continue
        if kind == "model":
            _unwrap(target).load_state_dict(value, strict=strict)
        else:
            target.load_state_dict(value)
        report.loaded.append(f"{kind} {index}")
    _restore_rest(contents, process_index, dataloaders, scaler, report)
    if report.not_mapped:
        warnings.warn(f"load_state({str(path)!r}) (an Accelerate checkpoint) could not map:\n  "
                      + "\n  ".join(report.not_mapped), stacklevel=3)
    return report


def _by_stem(contents: dict[str, Any], stem: str) -> list[Any]:
    return [contents[name] for name in sorted(contents, key=lambda n: (len(n), n)) if re.match(rf"^{stem}(_\d+)?\.", name)]


def _pair(kind: str, values: list[Any], targets: list[Any]) -> list[tuple[str, int, Any, Any]]:
    count = max(len(values), len(targets))
    return [(kind, i, values[i] if i < len(values) else None, targets[i] if i < len(targets) else None)
            for i in range(count)]


def _unwrap(model: Any) -> Any:
    while type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "_orig_mod", model)


def _with_aliases(model: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` plus every name of ``model`` that shares its tensor with a name the file holds: a tied
    weight (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) is stored once, under one name."""
    groups: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
            groups.setdefault(key, []).append(name)
    out = dict(weights)
    for names in groups.values():
        stored = next((name for name in names if name in weights), None)
        for name in names:
            if stored is not None and name not in out:
                out[name] = weights[stored]
    return out


def _check_models(plan: list[tuple[str, int, Any, Any]], report: AccelerateCheckpointReport) -> None:
    problems = []
    for kind, index, value, target in plan:
        if kind != "model" or value is None or target is None:
            continue
        own = set(_unwrap(target).state_dict())
        missing, unexpected = sorted(own - set(value)), sorted(set(value) - own)
        if missing:
            problems.append(f"model {index}: missing in the checkpoint (this run's model has them, the file does "
                            f"not): {missing[:5]}")
        if unexpected:
            problems.append(f"model {index}: in the checkpoint but not in this run's model: {unexpected[:5]}")
    if problems:
        raise CheckpointError("the Accelerate checkpoint's weights do not fit the prepared models (nothing was "
                              "loaded; pass strict=False to load what fits):\n  " + "\n  ".join(problems))


def _restore_rest(contents: dict[str, Any], process_index: int, dataloaders: list[Any], scaler: Any,
                  report: AccelerateCheckpointReport) -> None:
    """The scaler, the RNG states and step, and the samplers' epoch/seed."""
    if "scaler.pt" in contents:
        if scaler is not None:
            scaler.load_state_dict(contents["scaler.pt"])
            report.loaded.append("scaler")
        else:
            report.not_mapped.append("scaler.pt: this run has no loss scaler (mixed_precision is not fp16)")
    states = contents.get(f"random_states_{process_index}.pkl")
    if isinstance(states, dict):

        random.setstate(states["random_state"])
        np.random.set_state(states["numpy_random_seed"])
        torch.set_rng_state(states["torch_manual_seed"])
        if torch.cuda.is_available() and "torch_cuda_manual_seed" in states:
            torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])
        report.step = int(states.get("step", 0))
        report.loaded.append("random states")
    for index, sampler in enumerate(_by_stem(contents, "sampler")):
        loader = dataloaders[index] if index < len(dataloaders) else None
        seed, epoch = getattr(sampler, "initial_seed", None), getattr(sampler, "epoch", None)
        if loader is None or seed is None or not hasattr(loader, "load_state_dict"):
            report.not_mapped.append(f"sampler {index}: no prepared loader with a seeded order to take it")
            continue
        if epoch is not None and hasattr(loader, "set_epoch"):
            loader.set_epoch(int(epoch))
        report.loaded.append(f"sampler {index} (epoch {epoch})")
    for index, state in enumerate(_by_stem(contents, "dl_state_dict")):
        loader = dataloaders[index] if index < len(dataloaders) else None
        if loader is not None and getattr(loader, "use_stateful_dataloader", False):
            loader.load_state_dict(state)
            report.loaded.append(f"data loader {index}")


def load_into(holder: Any, folder: str | os.PathLike, *, allow_pickle: bool | None = None, strict: bool = True,
              load_kwargs: dict[str, Any] | None = None, distributed: bool = False) -> AccelerateCheckpointReport:
    """Load Accelerate's files in ``folder`` into the prepared objects of ``holder`` (a ``TrainingState``) as
    Accelerate's ``load_state`` does: the load pre-hooks get the models no engine or FSDP folder holds and may
    pop those they load themselves; then the step counter it read."""
    objects = holder.objects
    engine = holder.engine
    owned = engine.owns if engine is not None else (lambda obj: False)
    models = list(objects.models)
    path = Path(folder)
    # an FSDP2 folder loads into a sharded model and, resharded by DCP, into a plain one (overdrive's addition)
    special = [i for i, m in enumerate(models)
               if owned(m) or is_sharded(m) or (path / f"pytorch_model_fsdp_{i}").is_dir()]
    given = holder.hook_models()
    rest = [given[i] for i in range(len(models)) if i not in special]
    for hook in objects.load_hooks.values():
        hook(rest, str(folder))
    paired = [j for j in range(len(objects.optimizers)) if j in special and not owned(models[j])
              and (is_sharded(models[j]) or (path / f"optimizer_{j}").is_dir())]
    report = load_accelerate_checkpoint(
        folder, models=rest,
        optimizers=[o for j, o in enumerate(objects.optimizers) if not owned(o) and j not in paired],
        schedulers=[s for s in objects.schedulers if saved_as_file(s, engine)], dataloaders=objects.dataloaders,
        custom_objects=objects.custom_objects, scaler=holder.scaler, process_index=holder.process_index,
        allow_pickle=allow_pickle, strict=strict, load_kwargs=load_kwargs)
    for i in special:
        if not owned(models[i]):
            optimizer = objects.optimizers[i] if i in paired else None
            _load_sharded(path, i, models[i], optimizer, bool(allow_pickle), strict, distributed)
    if engine is not None and any(owned(m) for m in models):
        engine.load(path, models, allow_pickle=bool(allow_pickle),
                    scheduler_states=not any(owned(s) and saved_as_file(s, engine) for s in objects.schedulers))
    if report.step is not None:
        holder.window.step = report.step
    return report


class _NestedSafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner for Accelerate's nested ``{"model": ...}`` / ``{"optimizer": ...}`` folders, reading
    non-tensor values (optimizer hyperparameters) with ``weights_only=True`` unless ``allow_pickle``."""

    def __init__(self, allow_pickle: bool) -> None:
        super().__init__()
        self.allow_pickle = allow_pickle

    def load_bytes(self, read_item: Any, value: Any) -> None:
        key = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=not self.allow_pickle)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(f"the value {key!r} is not made of plain numbers, strings, containers and tensors, "
                                  f"so it was not unpickled ({exc}); pass allow_pickle=True if you trust the "
                                  "checkpoint") from None
        set_state_dict_element(self.original_state_dict, self.mappings[key], loaded)


def _load_sharded(folder: Path, index: int, model: Any, optimizer: Any, allow_pickle: bool, strict: bool,
                  distributed: bool) -> None:
    """FSDP2 model ``index`` (and its optimizer) from Accelerate's ``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/``
    folders, each process reading its own shards (a collective)."""

    def read(name: str, key: str, state: dict[str, Any]) -> dict[str, Any]:
        sub = folder / name
        if not sub.is_dir():
            raise CheckpointError(f"{folder} has no {name}/ folder for sharded (FSDP) model {index}; it was saved "
                                  "with another state_dict_type or another number of models")
        nested = {key: state}
        run_dcp(lambda: dcp.load(nested, storage_reader=SafeFileSystemReader(sub, allow_pickle=allow_pickle),
                                 planner=_NestedSafeLoadPlanner(allow_pickle), no_dist=not distributed))
        return nested[key]

    options = StateDictOptions(strict=strict)
    state = read(f"pytorch_model_fsdp_{index}", "model", get_model_state_dict(model))
    set_model_state_dict(model, state, options=options)
    if optimizer is not None:
        inner = getattr(optimizer, "optimizer", optimizer)
        optim_state = read(f"optimizer_{index}", "optimizer", get_optimizer_state_dict(model, inner))
        set_optimizer_state_dict(model, inner, optim_state, options=options)
