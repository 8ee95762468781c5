"""The pipeline's stage placement is a named override of the model path's ``placement`` step: this rank's
stages go to the device, or stay where they are with ``prepare(..., device_placement=False)`` (2 gloo ranks,
against one process on the same global batch)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.parallel import make_data, make_model, worst
from tests.transforms.pipeline.pipeline_helpers import LAYERS, pipeline_accelerator, reference

pytestmark = pytest.mark.multiprocess

STEPS = 4


def _stage_moves(device_placement: bool) -> dict[str, Any]:
    """Which modules ``.to(<the device>)`` was called on while preparing, and the losses of a few steps."""
    from torch import nn
    from torch.utils.data import DataLoader

    accelerator = pipeline_accelerator("1F1B")
    moved: list[int] = []
    original = nn.Module.to

    def recording_to(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        if args and str(args[0]) == str(accelerator.device):
            moved.append(id(module))
        return original(module, *args, **kwargs)

    model = make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    nn.Module.to = recording_to  # type: ignore[method-assign]
    try:
        model = accelerator.prepare_model(model, device_placement=device_placement)
    finally:
        nn.Module.to = original  # type: ignore[method-assign]
    opt, loader = accelerator.prepare(opt, DataLoader(make_data(), batch_size=8))
    losses = []
    for ids, labels in loader:
        loss = model(ids, labels=labels).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
        if len(losses) == STEPS:
            break
    stages = {id(stage) for stage in model.stage_modules}  # what the model path ran on
    return {"stages_moved": len(stages & set(moved)), "stages": len(stages), "losses": losses}


@pytest.mark.timeout(300)
def test_pipeline_stages_are_placed_unless_device_placement_is_false():
    placed = run_distributed(_stage_moves, 2, True, timeout=280)
    kept = run_distributed(_stage_moves, 2, False, timeout=280)
    expected = reference(8, STEPS, clip=None)
    for rank in range(2):
        assert placed[rank]["stages_moved"] == placed[rank]["stages"] >= 1, placed[rank]
        assert kept[rank]["stages_moved"] == 0, kept[rank]
        assert worst(placed[rank]["losses"], expected) < 1e-5
        assert worst(kept[rank]["losses"], expected) < 1e-5
