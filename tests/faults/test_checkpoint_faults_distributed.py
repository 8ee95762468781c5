"""Checkpoint faults on real gloo groups of 2 processes: a save called on one rank only."""

from __future__ import annotations

from pathlib import Path

from distributed import run_distributed


def _save_on_main_only(folder: str) -> dict:
    import torch

    from overdrive import Accelerator
    from overdrive.checkpoint import CheckpointError

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step() -> None:
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    out = {"error": None}
    if accelerator.is_main_process:  # the Accelerate idiom that cannot work: the other rank goes on training
        try:
            accelerator.save_state(folder)
        except CheckpointError as error:
            out["error"] = str(error)
    step()  # the other rank is already waiting in this step's all-reduce: the group is still usable
    accelerator.save_state(folder)  # called by every rank: works
    out["saved"] = sorted(p.name for p in Path(folder).iterdir())
    out["siblings"] = sorted(p.name for p in Path(folder).parent.iterdir())
    return out


def test_save_state_on_one_rank_fails_clearly_before_any_collective(tmp_path):
    folder = tmp_path / "ckpt"
    results = run_distributed(_save_on_main_only, 2, str(folder), timeout=150)
    error = results[0]["error"]
    assert error is not None and results[1]["error"] is None
    assert "save_state() was called on rank 0, but rank 1 went on to other collectives instead" in error
    assert "Every process must call save_state()" in error and "Nothing was written" in error
    for out in results:
        assert "manifest.json" in out["saved"] and out["siblings"] == ["ckpt"]  # no temporary folder left
