"""``Accelerator.step`` and ``sync_gradients`` per micro-batch, side by side with the real Accelerate: +1 per
``accumulate()``, back to 0 on a loader's last batch when ``sync_with_dataloader`` (and never otherwise)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.requires("accelerate")


def _trace(package: ModuleType, num_steps: int, sync_with_dataloader: bool) -> list[tuple[int, bool]]:
    """(step, sync_gradients) inside each accumulate(): two epochs of 10 batches, then 4 loader-less calls."""
    utils = importlib.import_module(f"{package.__name__}.utils")
    plugin = utils.GradientAccumulationPlugin(num_steps=num_steps, sync_with_dataloader=sync_with_dataloader)
    accelerator = package.Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=1)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    seen = []
    for _ in range(2):
        for _batch in data:
            with accelerator.accumulate(model):
                seen.append((accelerator.step, accelerator.sync_gradients))
    for _ in range(4):
        with accelerator.accumulate(model):
            seen.append((accelerator.step, accelerator.sync_gradients))
    return seen


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize(("num_steps", "sync_with_dataloader"), [(3, True), (3, False), (1, True), (4, True)])
def test_step_counts_as_accelerate_counts(num_steps, sync_with_dataloader):
    import accelerate

    import overdrive
    from overdrive.training.state import GradientState

    try:
        expected = _trace(accelerate, num_steps, sync_with_dataloader)
    finally:
        _reset_accelerate()
    try:
        got = _trace(overdrive, num_steps, sync_with_dataloader)
    finally:
        GradientState._reset_state()
    assert got == expected
    # the count really resets (or not) at the end of each epoch: the test could tell the two apart
    assert (got[9][0] == 0) is sync_with_dataloader
