"""save_fsdp_model / load_fsdp_model / save_fsdp_optimizer / load_fsdp_optimizer / merge_fsdp_weights with
Accelerate's signatures (what transformers' Trainer calls under FSDP), on one process."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from overdrive.utils import (
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_model_and_optimizer_round_trip_and_merge(tmp_path):
    model, optimizer = _trained()
    save_fsdp_model(None, None, model, tmp_path)
    save_fsdp_optimizer(None, None, optimizer, model, tmp_path)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh(torch.randn(3, 4)).sum().backward()
    fresh_optimizer.step()  # its own state, to be overwritten
    load_fsdp_model(None, None, fresh, tmp_path)
    load_fsdp_optimizer(None, None, fresh_optimizer, fresh, tmp_path)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(optimizer.state_dict()["state"][0][key], fresh_optimizer.state_dict()["state"][0][key])
    merge_fsdp_weights(tmp_path / "pytorch_model_fsdp_0", tmp_path / "merged")
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert set(merged) == set(model.state_dict())
    assert all(torch.equal(merged[k], v) for k, v in model.state_dict().items())
