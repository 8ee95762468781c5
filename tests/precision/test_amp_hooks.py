"""The autocast hooks of ``mixed_precision="bf16"``: eager, nested, and under a whole-model ``torch.compile``
(which traces the hooks), each against plain PyTorch's ``with torch.autocast(...)`` around the forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from overdrive import Accelerator, TorchDynamoPlugin
from overdrive.training.state import AcceleratorState, GradientState


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def plain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    loss = F.cross_entropy(out.float(), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def overdrive_step(accelerator: Accelerator, model: nn.Module, x: torch.Tensor,
                   y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(x)
    assert out.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    loss = F.cross_entropy(out, y)
    accelerator.backward(loss)
    return loss.detach(), [p.grad.clone() for p in accelerator.unwrap_model(model).parameters()]


@pytest.fixture(autouse=True)
def fresh_state():
    AcceleratorState._reset_state()
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state()
    GradientState._reset_state()


@pytest.mark.parametrize("compile_backend", [None, "eager"], ids=["eager", "whole-model-compile"])
def test_bf16_hooks_equal_plain_autocast_each_step(compile_backend: str | None):
    """Three forwards (the hooks' one region object is reused) give plain autocast's losses and gradients,
    bit for bit; compiled in place the hooks are traced by dynamo, which once failed at the region's exit."""
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)) for _ in range(3)]
    plugin = TorchDynamoPlugin(backend=compile_backend) if compile_backend else None
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_plugin=plugin)
    model, reference = accelerator.prepare(make_model()), make_model()
    for x, y in batches:
        loss, grads = overdrive_step(accelerator, model, x, y)
        want_loss, want_grads = plain_step(reference, x, y)
        assert torch.equal(loss, want_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))
        model.zero_grad()
        reference.zero_grad()


def test_a_forward_nested_in_the_same_models_forward_gets_its_own_region():
    """A model whose forward calls itself again (depth 2): both levels run under autocast and the outer
    region is restored correctly (autocast is off again afterwards)."""

    class Recursive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, depth: int = 1) -> torch.Tensor:
            assert torch.is_autocast_enabled("cpu")
            inner = self(x, depth - 1) if depth else x
            assert torch.is_autocast_enabled("cpu")  # the inner forward's exit left the outer region on
            return self.linear(inner)

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(Recursive())
    x = torch.randn(2, 8)
    out = model(x)
    torch.manual_seed(0)
    reference = Recursive()
    reference.load_state_dict(accelerator.unwrap_model(model).state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(x)
    assert out.dtype == torch.float32 and torch.equal(out, want.float())
    assert not torch.is_autocast_enabled("cpu")


def test_a_prepared_model_compiled_by_the_user_runs_under_autocast():
    """``torch.compile(prepared_model)`` (an outer wrapper: dynamo traces the prepared model's hooks) gives plain
    autocast's outputs and leaves autocast off; it once failed at the region's exit (``no attribute 'prev'``)."""
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model, reference = accelerator.prepare(make_model()), make_model()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    for _ in range(2):
        out = compiled(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = reference(x)
        assert out.dtype == torch.float32 and torch.equal(out, want.float())
        assert not torch.is_autocast_enabled("cpu")


def test_the_hooks_restore_an_enclosing_autocast_region():
    """A prepared bf16 model called inside the user's own ``torch.autocast(..., enabled=False)`` region: the
    forward runs in bf16 (the hooks open their region) and the user's settings are back afterwards."""
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model, reference = accelerator.prepare(make_model()), make_model()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.float16, enabled=False, cache_enabled=False):
        out = model(x)
        assert not torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.float16 and not torch.is_autocast_cache_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(x)
    assert torch.equal(out, want.float())
