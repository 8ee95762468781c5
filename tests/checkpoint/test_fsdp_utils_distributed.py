"""save_fsdp_model / load_fsdp_model / save_fsdp_optimizer / load_fsdp_optimizer on 2 processes with FSDP2 on
gloo (what transformers' Trainer calls under FSDP): a fresh run loaded from the folders continues exactly
like the saved one; a second save replaces the folder with no temporary left; a damaged folder is refused
and the model and optimizer stay as they were; the folder is Accelerate's (``pytorch_model_fsdp_0``-style DCP
with ``model.<name>`` keys)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.support.distributed import run_distributed


def _setup(seed: int) -> tuple[Any, nn.Module, Any]:
    from overdrive import Accelerator
    from overdrive.config import FullyShardedDataParallelPlugin

    torch.manual_seed(seed)
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=100))
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    return acc, model, opt


def _steps(acc: Any, model: nn.Module, opt: Any, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed + 100 * acc.process_index)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _full(acc: Any, model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in acc.get_state_dict(model).items()}


def _save_and_load(root: str) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from overdrive.checkpoint import CheckpointError
    from overdrive.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    acc, model, opt = _setup(0)
    _steps(acc, model, opt, 1)
    save_fsdp_model(None, acc, model, root)  # a first save, replaced by the next one
    _steps(acc, model, opt, 2)
    save_fsdp_model(None, acc, model, root)
    save_fsdp_optimizer(None, acc, opt, model, root)
    saved = _full(acc, model)
    after = _steps(acc, model, opt, 3)

    acc2, model2, opt2 = _setup(5)
    load_fsdp_model(None, acc2, model2, root)
    load_fsdp_optimizer(None, acc2, opt2, model2, root)
    loaded = _full(acc2, model2)
    resumed = _steps(acc2, model2, opt2, 3)

    # a damaged folder: refused on every rank, and nothing of model3 / opt3 changed
    acc3, model3, opt3 = _setup(7)
    _steps(acc3, model3, opt3, 4)
    before = (_full(acc3, model3), {k: v.clone() for k, v in opt3.state_dict()["state"][0].items()})
    acc.wait_for_everyone()
    if acc.process_index == 0:
        data = Path(root, "pytorch_model_fsdp_0", "__1_0.distcp")
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    acc.wait_for_everyone()
    refused = ""
    try:
        load_fsdp_model(None, acc3, model3, root)
    except CheckpointError as exc:
        refused = str(exc)
    unchanged = _full(acc3, model3)
    return {"sharded": all(isinstance(p, DTensor) for p in model2.parameters()), "after": after,
            "resumed": resumed, "same_weights": all(torch.equal(saved[k], loaded[k]) for k in saved),
            "refused": refused, "unchanged": all(torch.equal(before[0][k], unchanged[k]) for k in unchanged),
            "listing": sorted(os.listdir(root))}


@pytest.mark.timeout(240)
def test_fsdp2_model_and_optimizer_folders_on_two_processes(tmp_path: Path) -> None:
    results = run_distributed(_save_and_load, 2, str(tmp_path), timeout=220)
    for r in results:
        assert r["sharded"] and r["same_weights"]
        assert r["resumed"] == r["after"]  # weights and Adam state restored: the same next losses
        assert "load_fsdp_model" in r["refused"] and r["unchanged"]
    assert results[0]["listing"] == ["optimizer_0", "pytorch_model_fsdp_0"]  # no temporary or old folder left
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(str(tmp_path / "optimizer_0")).read_metadata().state_dict_metadata)
    assert any(k.startswith("optimizer.state.") for k in keys)
    model_keys = set(FileSystemReader(str(tmp_path / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata)
    assert model_keys == {"model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"}
