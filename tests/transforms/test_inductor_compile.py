"""A real inductor compile on the CPU through ``prepare()``: inductor generates C++ kernels (built with the
machine's C++ compiler), and the compiled model's outputs and gradients equal eager PyTorch's.

Slow: a cold inductor compile takes about a minute here (the default cache makes later runs faster)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from overdrive import Accelerator, GradientState, TorchDynamoPlugin
from overdrive.transforms.compile import compiled_in_place

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                 reason="inductor's CPU backend needs a C++ compiler")]


class GatedMLP(nn.Module):
    """Pointwise work around two matmuls, so inductor fuses it into C++ kernels of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)) * torch.sigmoid(x.sum(-1, keepdim=True)))


def _make() -> GatedMLP:
    torch.manual_seed(0)
    return GatedMLP()


def test_inductor_compiles_the_prepared_model_and_matches_eager() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="inductor"))
    model = accelerator.prepare(_make())
    reference = _make()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    out = model(x)
    out.square().sum().backward()
    expected = reference(x)
    expected.square().sum().backward()
    assert compiled_in_place(model) and counters["stats"]["unique_graphs"] >= 1
    # inductor ran: it compiled the graphs now, or loaded the C++ it compiled before from its cache
    inductor = counters["inductor"]
    assert inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_hit"] >= 1, dict(inductor)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert mine.grad is not None and torch.allclose(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)
    accelerator.free_memory()
