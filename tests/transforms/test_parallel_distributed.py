"""Composed layouts on 4 gloo ranks: FSDP2 + tensor parallel (2-D, with and without sequence parallel)
and HSDP (replicate x shard) follow the one-process trajectory; a checkpoint saved under FSDP2 + TP
resumes under HSDP and under 4-way FSDP2, and ``save_model`` writes the consolidated weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.parallel import make_model, reference_losses, worst

pytestmark = pytest.mark.slow  # 4 processes

STEPS, SAVE_AT = 20, 10
TOLERANCE = 1e-5  # measured <= 1e-6
LAYOUTS = {
    "fsdp2 x tp": {"dp_shard_size": 2, "tp_size": 2},
    "fsdp2 x tp + sequence parallel": {"dp_shard_size": 2, "tp_size": 2, "sp": True},
    "hsdp": {"dp_replicate_size": 2, "dp_shard_size": 2},
    "fsdp2 x 4": {"dp_shard_size": 4},
}


def train(layout: dict[str, Any], steps: int, folder: str | None = None, save_at: int | None = None,
          resume: str | None = None, seed: int = 0) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from overdrive import Accelerator, DataLoaderConfiguration
    from overdrive.config import ParallelismConfig, TorchTensorParallelPlugin
    from tests.support.parallel import loss_fn, make_data

    sizes = {k: v for k, v in layout.items() if k != "sp"}
    tp = TorchTensorParallelPlugin(sequence_parallel=layout.get("sp", False))
    # exact_resume: a resumed run's loader continues at the saved step, also under another layout
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes, tp_handler=tp),
                              dataloader_config=DataLoaderConfiguration(exact_resume=True))
    model = make_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_data(), batch_size=8 // accelerator.data_parallel_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if resume:
        accelerator.load_state(resume)
    losses = []
    for ids, labels in loader:
        loss = loss_fn(model(ids), labels)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
        if save_at == len(losses):
            accelerator.save_state(f"{folder}/state")
            accelerator.save_model(model, f"{folder}/model")
        if len(losses) == steps:
            break
    accelerator.free_memory()
    return {"losses": losses, "mesh": str(accelerator.torch_device_mesh)}


def _every_layout(folder: str) -> dict[str, Any]:
    out = {name: train(layout, STEPS) for name, layout in LAYOUTS.items() if name != "fsdp2 x tp"}
    out["fsdp2 x tp"] = train(LAYOUTS["fsdp2 x tp"], STEPS, folder, save_at=SAVE_AT)
    for name in ("hsdp", "fsdp2 x 4"):  # a different seed: everything must come from the checkpoint
        out[f"resumed under {name}"] = train(LAYOUTS[name], STEPS - SAVE_AT, resume=f"{folder}/state", seed=7)
    return out


@pytest.mark.timeout(300)
def test_composed_layouts_follow_the_reference_and_checkpoints_move_between_layouts(tmp_path: Path):
    results = run_distributed(_every_layout, 4, str(tmp_path), timeout=280)
    reference = reference_losses(8, STEPS, clip=1.0)
    for name in LAYOUTS:
        for rank, result in enumerate(results):
            assert worst(result[name]["losses"], reference) <= TOLERANCE, (name, rank)
    assert results[0]["hsdp"]["mesh"] == "DeviceMesh((dp_replicate=2, dp_shard=2), 'cpu', stride=(2, 1))"
    for name in ("hsdp", "fsdp2 x 4"):
        resumed = results[0][f"resumed under {name}"]["losses"]
        assert worst(resumed, reference[SAVE_AT:]) <= TOLERANCE, (name, resumed, reference[SAVE_AT:])

    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    model = make_model()
    reference_losses(8, SAVE_AT, clip=1.0, model=model)
    expected = model.state_dict()
    assert sorted(saved) == sorted(expected)
    assert max((saved[k] - expected[k]).abs().max().item() for k in expected) < 1e-5
