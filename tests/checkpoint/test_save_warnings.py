"""A warning a save gives is said once per run, by the main process, however many ranks save how often."""

from __future__ import annotations

import os
import tempfile
import warnings

import pytest

from tests.support.distributed import run_distributed


def _save_mid_window_three_times(folder: str) -> int:
    """The mid-window warnings this rank gave in three saves, each in the middle of a window."""
    import torch

    from overdrive import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4, project_dir=folder)
    model = torch.nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    said = 0
    for save in range(3):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            optimizer.step()
            optimizer.zero_grad()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelerator.save_state(os.path.join(folder, f"save{save}"))
        said += sum("middle of an accumulation window" in str(w.message) for w in caught)
    return said


@pytest.mark.timeout(180)
def test_a_save_in_the_middle_of_a_window_warns_once_per_run_from_the_main_process():
    with tempfile.TemporaryDirectory() as folder:
        assert run_distributed(_save_mid_window_three_times, 2, folder) == [1, 0]
