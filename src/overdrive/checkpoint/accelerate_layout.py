"""``save_state(..., accelerate_layout=True)``: also write Hugging Face Accelerate's files (moving a run back).

Beside overdrive's own files, the checkpoint folder then holds what Accelerate 1.x's ``save_state`` writes
and its ``load_state`` reads: ``model[_i].safetensors`` (or ``pytorch_model[_i].bin`` with
``safe_serialization=False``), ``optimizer[_i].bin``, ``scheduler[_i].bin``, ``scaler.pt``,
``custom_checkpoint_<i>.pkl`` (all by the main process) and ``random_states_<rank>.pkl`` (step count and
RNG states, by every process). The state dicts are those of the prepared objects, as Accelerate saves
them (the weights of the models Accelerate keeps in ``_models``: no DDP ``module.`` prefix). One process or DDP only: the main
process must hold the whole state (a sharded run is refused with a clear error).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from overdrive.checkpoint.errors import CheckpointError
from overdrive.training.prepared import TrainingState


def check_layout_possible(run: TrainingState) -> None:
    """Refuse ``accelerate_layout=True`` for a run whose state no single process holds (FSDP2, DeepSpeed)."""
    from torch.distributed.tensor import DTensor

    sharded = any(isinstance(p, DTensor) for model in run.objects.models for p in model.parameters())
    if run.engine is not None or sharded:
        raise CheckpointError("save_state(accelerate_layout=True) writes Accelerate's files for a one-process or "
                              "DDP run only; this run's state is sharded (FSDP2 / DeepSpeed). Save without "
                              "accelerate_layout and use `overdrive merge-weights` for the model weights")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict on the CPU, each storage once (safetensors refuses shared tensors)."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue  # a tied weight: Accelerate keeps only its first name too
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def _indexed(stem: str, suffix: str, index: int) -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def write_accelerate_files(run: TrainingState, folder: Path, rank: int, is_main: bool, kept: list[int],
                           rng: dict[str, Any], safe_serialization: bool) -> list[str]:
    """Write Accelerate's files for this process into ``folder``; return their names. ``kept``: the models
    that no save hook saved itself (renumbered from 0, as Accelerate does); ``rng``: ``capture_rng``'s
    states, the ones overdrive's own files hold."""
    written: list[str] = []
    if is_main:
        models = run.hook_models()  # Accelerate's `_models`: what its save_state takes the weights of
        for out, i in enumerate(kept):
            weights = _weights(models[i])
            if safe_serialization:
                from safetensors.torch import save_file

                name = _indexed("model", ".safetensors", out)
                save_file(weights, str(folder / name), metadata={"format": "pt"})
            else:
                name = _indexed("pytorch_model", ".bin", out)
                torch.save(weights, folder / name)
            written.append(name)
        pieces = [("optimizer", ".bin", run.objects.optimizers), ("scheduler", ".bin", run.objects.schedulers)]
        for stem, suffix, objects in pieces:
            for i, obj in enumerate(objects):
                written.append(_indexed(stem, suffix, i))
                torch.save(obj.state_dict(), folder / written[-1])
        if run.scaler is not None:
            torch.save(run.scaler.state_dict(), folder / "scaler.pt")
            written.append("scaler.pt")
        for i, obj in enumerate(run.objects.custom_objects):
            written.append(f"custom_checkpoint_{i}.pkl")
            torch.save(obj.state_dict(), folder / written[-1])
    states: dict[str, Any] = {"step": run.window.step, "random_state": rng.get("python", random.getstate()),
                              "torch_manual_seed": rng["torch"]}
    if "numpy" in rng:
        states["numpy_random_seed"] = rng["numpy"]
    device = rng.get("device")
    if device is not None and device["type"] == "cuda":
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    written.append(f"random_states_{rank}.pkl")
    torch.save(states, folder / written[-1])
    return written
