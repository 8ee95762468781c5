"""``accelerator.backward(loss, scale_wrt_gas=...)`` under DeepSpeed as transformers' Trainer calls it: the
Trainer divides the loss over the accumulation steps itself and passes ``scale_wrt_gas=False``, so overdrive
must not divide again (it did, and also passed the keyword twice): the weights after one accumulated step
equal those of the plain ``backward(loss)``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed, pytest.mark.usefixtures("one_process_group")]


def _weights(mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    from overdrive import Accelerator, DeepSpeedPlugin, GradientState

    GradientState._reset_state()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(
        zero_stage=2, gradient_clipping=0.0, gradient_accumulation_steps=2))
    model = torch.nn.Linear(4, 1)
    start = model.weight.detach().clone()
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(6, 4, generator=g)), batch_size=3)
    model, optimizer, data = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), data)
    for (x,) in data:
        with accelerator.accumulate(model):
            loss = model(x).pow(2).mean()
            if mode == "trainer":
                accelerator.backward(loss / 2, scale_wrt_gas=False)  # what transformers' Trainer does
            else:
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    weight = accelerator.unwrap_model(model).weight.detach().clone()
    accelerator.free_memory()
    return start, weight


def test_scale_wrt_gas_as_the_trainer_passes_it():
    start, plain = _weights("plain")
    assert not torch.equal(start, plain)  # one step was taken
    assert torch.allclose(_weights("trainer")[1], plain, atol=1e-7)
