"""Checkpoint faults on real gloo groups of 2 processes: a save called on one rank only.

Under DDP the main process holds the whole training state, and Accelerate saves it when only the main process
calls ``save_state`` (diffusers' training examples do: ``if accelerator.is_main_process:
accelerator.save_state(...)``); overdrive does too. With sharded parameters (FSDP2) no process holds the whole
state: the call fails clearly on that rank, before any collective, and the group stays usable.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from tests.support.distributed import run_distributed


def _save_on_main_only(folder: str, sharded: bool) -> dict:
    import torch

    from overdrive import Accelerator
    from overdrive.checkpoint import CheckpointError
    from overdrive.config import FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin() if sharded else None)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step() -> None:
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()] if not sharded else []
    out: dict = {"error": None}
    if accelerator.is_main_process:
        try:
            accelerator.save_state(folder)
        except CheckpointError as error:
            out["error"] = str(error)
    step()  # the other rank is already waiting in this step's all-reduce: the group is still usable
    if sharded:
        accelerator.save_state(folder)  # called by every rank: works
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelerator.load_state(folder)  # every rank reads what the main process saved
        out["restored"] = all(torch.equal(p, w) for p, w in zip(accelerator.unwrap_model(model).parameters(), weights))
        out["warnings"] = [str(w.message) for w in caught]
        step()  # and trains on
    out["saved"] = sorted(p.name for p in Path(folder).iterdir())
    out["siblings"] = sorted(p.name for p in Path(folder).parent.iterdir())
    return out


def test_save_state_on_the_main_process_only_saves_a_ddp_run_as_accelerate_does(tmp_path):
    folder = tmp_path / "ckpt"
    results = run_distributed(_save_on_main_only, 2, str(folder), False, timeout=150)
    assert [out["error"] for out in results] == [None, None]
    assert all(out["restored"] for out in results)  # the weights of the step the main process saved, on every rank
    for out in results:
        assert {"manifest.json", "state.json", "rank_0.json"} <= set(out["saved"]) and "rank_1.json" not in out["saved"]
        assert out["siblings"] == ["ckpt"]  # no temporary folder left
    # as Accelerate: the rank without a saved RNG state keeps its own, and says so
    assert any("rank 1 has no saved RNG state" in w for w in results[1]["warnings"]), results[1]["warnings"]


def test_save_state_on_one_rank_of_a_sharded_run_fails_clearly_before_any_collective(tmp_path):
    folder = tmp_path / "ckpt"
    results = run_distributed(_save_on_main_only, 2, str(folder), True, timeout=150)
    error = results[0]["error"]
    assert error is not None and results[1]["error"] is None
    assert "save_state() was called on rank 0, but rank 1 went on to other collectives instead" in error
    assert "Every process must call save_state()" in error and "Nothing was written" in error
    for out in results:
        assert "manifest.json" in out["saved"] and out["siblings"] == ["ckpt"]  # no temporary folder left
