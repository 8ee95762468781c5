"""The files Hugging Face Accelerate's ``save_state`` writes, as ``save_state`` writes them by default.

Accelerate 1.16.0 names and shapes them so (``_i`` from the second object of a kind on):

- models: ``model[_i].safetensors`` (``pytorch_model[_i].bin`` with ``safe_serialization=False``), the main
  process's copy of the weights Accelerate keeps in ``_models`` (no DDP ``module.`` prefix, a tied weight
  once); numbered after the save pre-hooks, which pop the models they save themselves;
- FSDP2 (sharded, Accelerate's default ``SHARDED_STATE_DICT``): ``pytorch_model_fsdp_<i>/`` and
  ``optimizer_<i>/``, ``torch.distributed.checkpoint`` folders of ``{"model": ...}`` and
  ``{"optimizer": ...}`` that every process writes its part of;
- DeepSpeed: the engine's own checkpoint ``pytorch_model[_i]/`` (weights, ZeRO partitions, its scheduler)
  and the ``latest`` file naming it;
- ``optimizer[_i].bin``, ``scheduler[_i].bin`` (of the objects no engine owns), ``dl_state_dict[_i].bin``
  (stateful loaders), ``scaler.pt``, ``custom_checkpoint_<i>.pkl`` by the main process, all ``torch.save``;
- ``random_states_<rank>.pkl`` by every process: the step and the Python, NumPy and torch RNG states.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from overdrive.checkpoint.group import run_dcp
from overdrive.training.prepared import TrainingState


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded ``DTensor``s (FSDP2): no process holds its whole state."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def saved_as_file(scheduler: Any, engine: Any) -> bool:
    """Whether Accelerate keeps ``scheduler`` in ``scheduler[_i].bin``: every scheduler but one that DeepSpeed
    built from its config (the engine checkpoint holds that one; a scheduler of the script's own, even when
    the engine steps it, is the script's to save, as Accelerate's ``AcceleratedScheduler``)."""
    if engine is None or not engine.owns(scheduler):
        return True
    inner = getattr(scheduler, "scheduler", scheduler)
    return not type(inner).__module__.startswith("deepspeed")


def weights_once(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``state`` on the CPU, each storage once under its first name (safetensors refuses shared tensors)."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue  # a tied weight: Accelerate keeps only its first name too
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def indexed(stem: str, suffix: str, index: int) -> str:
    """Accelerate's numbering: ``stem.suffix`` for the first, ``stem_<i>.suffix`` after."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def _save_dcp(folder: Path, state: dict[str, Any], distributed: bool) -> None:
    """One ``torch.distributed.checkpoint`` folder, written as Accelerate's FSDP code writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    run_dcp(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)),
                             planner=DefaultSavePlanner(), no_dist=not distributed))


def _write_models(run: TrainingState, folder: Path, distributed: bool, is_main: bool, kept: list[int],
                  safe_serialization: bool) -> None:
    engine = run.engine
    models = run.hook_models()  # Accelerate's `_models`: what its save_state takes the weights of
    plain = 0
    for i in kept:
        model = run.objects.models[i]
        if engine is not None and engine.owns(model):
            continue  # the engine's pytorch_model folder
        if is_sharded(model):  # every process writes its shards
            state = get_model_state_dict(model, options=StateDictOptions(cpu_offload=True))
            _save_dcp(folder / f"pytorch_model_fsdp_{i}", {"model": state}, distributed)
            continue
        if is_main:
            weights = weights_once(models[i].state_dict())
            if safe_serialization:
                save_file(weights, str(folder / indexed("model", ".safetensors", plain)), metadata={"format": "pt"})
            else:
                torch.save(weights, folder / indexed("pytorch_model", ".bin", plain))
        plain += 1


def _write_optimizers(run: TrainingState, folder: Path, distributed: bool, is_main: bool) -> None:
    engine = run.engine
    plain = 0
    for j, prepared in enumerate(run.objects.optimizers):
        if engine is not None and engine.owns(prepared):
            continue
        inner = getattr(prepared, "optimizer", prepared)
        models = run.objects.models
        if j < len(models) and is_sharded(models[j]):  # Accelerate pairs optimizer j with model j
            state = get_optimizer_state_dict(models[j], inner, options=StateDictOptions(cpu_offload=True))
            _save_dcp(folder / f"optimizer_{j}", {"optimizer": state}, distributed)
            continue
        if is_main:
            torch.save(inner.state_dict(), folder / indexed("optimizer", ".bin", plain))
        plain += 1


def tensors_written(run: TrainingState, rank: int) -> dict[str, Any]:
    """The tensors this process writes into Accelerate's files (to check the free space before writing):
    the models and optimizer states of the main process, and every process's shards of sharded ones."""
    engine = run.engine
    out: dict[str, Any] = {}
    for i, model in enumerate(run.objects.models):
        if (engine is None or not engine.owns(model)) and (rank == 0 or is_sharded(model)):
            out.update({f"model_{i}.{k}": v for k, v in model.state_dict().items()})
    for j, prepared in enumerate(run.objects.optimizers):
        if engine is not None and engine.owns(prepared):
            continue
        inner = getattr(prepared, "optimizer", prepared)
        sharded = any(is_sharded(m) for m in run.objects.models)
        if rank == 0 or sharded:
            out.update({f"optimizer_{j}.{id(p)}.{k}": v for p, values in inner.state.items()
                        for k, v in values.items()})
    return out


def write_accelerate_files(run: TrainingState, folder: Path, rank: int, distributed: bool, kept: list[int],
                           rng: dict[str, Any], safe_serialization: bool) -> None:
    """Write Accelerate's files into ``folder`` (a collective when a model is sharded: call on every process).
    ``kept``: the models that no save hook saved itself; ``rng``: ``capture_rng``'s states, the ones
    overdrive's own files hold."""
    is_main = rank == 0
    engine = run.engine
    _write_models(run, folder, distributed, is_main, kept, safe_serialization)
    _write_optimizers(run, folder, distributed, is_main)
    if is_main:
        schedulers = [s for s in run.objects.schedulers if saved_as_file(s, engine)]
        for i, scheduler in enumerate(schedulers):
            torch.save(scheduler.state_dict(), folder / indexed("scheduler", ".bin", i))
        for i, loader in enumerate(run.objects.dataloaders):
            if getattr(loader, "use_stateful_dataloader", False):
                torch.save(loader.state_dict(), folder / indexed("dl_state_dict", ".bin", i))
        if run.scaler is not None:
            torch.save(run.scaler.state_dict(), folder / "scaler.pt")
        for i, obj in enumerate(run.objects.custom_objects):
            torch.save(obj.state_dict(), folder / f"custom_checkpoint_{i}.pkl")
    states: dict[str, Any] = {"step": run.window.step, "random_state": rng.get("python", random.getstate()),
                              "torch_manual_seed": rng["torch"]}
    if "numpy" in rng:
        states["numpy_random_seed"] = rng["numpy"]
    device = rng.get("device")
    if device is not None and device["type"] == "cuda":
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    torch.save(states, folder / f"random_states_{rank}.pkl")
