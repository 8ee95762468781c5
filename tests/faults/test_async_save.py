"""``save_state(async_save=True)``: what was staged is what gets published, training goes on meanwhile (also
on 2 processes, whose background collectives use a group of their own), total_limit applies, and
end_training waits. (A kill -9 during the background write: test_kill_during_save.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from overdrive import Accelerator, ProjectConfiguration
from overdrive.training.state import GradientState
from tests.support.distributed import run_distributed


@pytest.fixture(autouse=True)
def _fresh_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def _run(**project):
    accelerator = Accelerator(project_config=ProjectConfiguration(**project))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(model, optimizer) -> None:
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _state(model, optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    return tensors + [v.clone() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def test_async_save_publishes_the_state_of_the_call_while_training_goes_on(tmp_path):
    accelerator, model, optimizer = _run(project_dir=str(tmp_path), automatic_checkpoint_naming=True,
                                         total_limit=2, async_save=True)
    saved = []
    for _ in range(3):
        _step(model, optimizer)
        saved.append(_state(model, optimizer))
        accelerator.save_state()  # the default from ProjectConfiguration(async_save=True)
        _step(model, optimizer)  # changes every tensor while the save is written
    accelerator.end_training()  # waits for the last one
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1", "checkpoint_2"]  # total_limit=2
    GradientState._reset_state()
    other, model2, optimizer2 = _run(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    _step(model2, optimizer2)
    other.load_state()  # the newest: checkpoint_2, the third save
    assert all(torch.equal(a, b) for a, b in zip(_state(model2, optimizer2), saved[2]))
    assert other.project_configuration.iteration == 3


def test_a_load_waits_for_a_pending_async_save(tmp_path):
    accelerator, model, optimizer = _run()
    _step(model, optimizer)
    folder = accelerator.save_state(tmp_path / "ok", async_save=True)
    assert accelerator.load_state(folder) == folder  # a load waits for the pending save first
    from overdrive.checkpoint.background import wait_for_pending_save

    assert wait_for_pending_save() is None  # nothing pending any more


def _two_ranks(folder: str) -> dict:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    step = lambda: (model(torch.randn(4, 64)).sum().backward(), optimizer.step(), optimizer.zero_grad())  # noqa: E731
    step()
    before = _state(model, optimizer)
    accelerator.save_state(folder, async_save=True)
    for _ in range(5):  # DDP all-reduces on the default group while the save's collectives run on its own
        step()
    accelerator.wait_for_everyone()
    accelerator.load_state(folder)
    return {"equal": all(torch.equal(a, b) for a, b in zip(_state(model, optimizer), before)),
            "files": sorted(p.name for p in Path(folder).iterdir())}


def test_async_save_on_two_processes_overlaps_training(tmp_path):
    results = run_distributed(_two_ranks, 2, str(tmp_path / "ckpt"), timeout=150)
    for out in results:
        assert out["equal"]
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json"} <= set(out["files"])
