"""ARCHITECTURE.md's recipe "a transform": an in-place function (tests/transforms/freeze_embeddings.py) passed to
one Accelerator's strategy, or run by a strategy subclass, under the single strategy and under DDP on 2 real
processes, compared with plain PyTorch training the same model with its embeddings frozen by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from overdrive import Accelerator, ActivationCheckpointingKwargs, GradientState
from overdrive.strategies import register_strategy
from overdrive.transforms.compile import compiled_in_place
from tests.support.distributed import run_distributed
from tests.support.parallel import accelerated_losses, make_model, reference_losses, worst
from tests.transforms.freeze_embeddings import FrozenEmbeddingsDDP, freeze_embeddings
from tests.transforms.test_model_path import is_checkpointed

STEPS = 4


def frozen_reference(global_batch: int) -> tuple[list[float], nn.Module]:
    """Plain PyTorch: the model with its embedding tables frozen by hand, trained on one process."""
    model = make_model()
    model.embed.weight.requires_grad_(False)
    model.pos.weight.requires_grad_(False)
    return reference_losses(global_batch, STEPS, model=model), model


def trained(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_callable_given_to_the_single_strategy_runs_and_matches_plain_pytorch():
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    assert accelerator.strategy.name == "single"
    accelerator.strategy.extra_transforms.append(freeze_embeddings)
    out = accelerated_losses(accelerator, 8, STEPS)
    expected, reference = frozen_reference(8)
    model = accelerator.unwrap_model(out["model"])
    assert not model.embed.weight.requires_grad and model.head.weight.requires_grad
    assert worst(out["losses"], expected) < 1e-5
    mine, theirs, initial = trained(model), trained(reference), trained(make_model())
    assert torch.equal(mine["embed.weight"], initial["embed.weight"])
    unfrozen = make_model()
    reference_losses(8, STEPS, model=unfrozen)
    assert not torch.allclose(unfrozen.embed.weight, initial["embed.weight"], atol=1e-4)  # without it they train
    assert all(torch.allclose(mine[name], theirs[name], atol=1e-5) for name in theirs)
    # one Accelerator's strategy, not a global registry: the next one does not run it
    assert all(p.requires_grad for p in Accelerator(cpu=True).prepare(make_model()).parameters())


def test_it_runs_after_activation_checkpointing_and_before_compile():
    seen: dict[str, bool] = {}

    def record(model: nn.Module) -> None:
        seen["checkpointed"] = all(is_checkpointed(block) for block in model.layers)
        seen["compiled"] = compiled_in_place(model)

    accelerator = Accelerator(cpu=True, kwargs_handlers=[ActivationCheckpointingKwargs()], dynamo_backend="eager")
    accelerator.strategy.extra_transforms.append(record)
    model = accelerator.prepare(make_model())
    assert seen == {"checkpointed": True, "compiled": False} and compiled_in_place(model)


def _ddp() -> dict[str, Any]:
    found = {}
    for how in ("callable", "subclass"):
        GradientState._reset_state()
        if how == "subclass":  # the strategy the resolver names "ddp", in this process (each rank its own)
            register_strategy("ddp", FrozenEmbeddingsDDP)
        accelerator = Accelerator()
        if how == "callable":
            accelerator.strategy.extra_transforms.append(freeze_embeddings)
        out = accelerated_losses(accelerator, 4, STEPS)  # 4 per rank: the reference's batch of 8
        model = accelerator.unwrap_model(out["model"])
        found[how] = {"strategy": type(accelerator.strategy).__name__, "losses": out["losses"], "params": trained(model),
                      "wrapped": type(out["model"]).__name__}
    return found


@pytest.mark.multiprocess
def test_ddp_on_two_processes_runs_it_before_data_parallel_and_matches_plain_pytorch():
    results = run_distributed(_ddp, 2, timeout=180)
    expected, reference = frozen_reference(8)
    initial, theirs = trained(make_model()), trained(reference)
    for rank in results:
        assert rank["callable"]["strategy"] == "DDPStrategy" and rank["subclass"]["strategy"] == "FrozenEmbeddingsDDP"
        for found in rank.values():
            assert found["wrapped"] == "DistributedDataParallel"
            assert worst(found["losses"], expected) < 1e-5
            assert torch.equal(found["params"]["embed.weight"], initial["embed.weight"])
            assert all(torch.allclose(found["params"][name], theirs[name], atol=1e-5) for name in theirs)
