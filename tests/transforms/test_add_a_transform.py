"""ARCHITECTURE.md's recipe "a transform": one module (tests/transforms/freeze_embeddings.py) that registers its
step, run by ``accelerator.prepare`` under the single strategy and under DDP on 2 real processes, and compared
with plain PyTorch training the same model with its embeddings frozen; a strategy overrides the step by name."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from tests.support.distributed import run_distributed
from tests.support.parallel import accelerated_losses, make_model, reference_losses, worst

STEPS = 4
MODULE = "tests.transforms.freeze_embeddings"


def frozen_reference(global_batch: int) -> tuple[list[float], nn.Module]:
    """Plain PyTorch: the model with its embedding tables frozen by hand, trained on one process."""
    model = make_model()
    model.embed.weight.requires_grad_(False)
    model.pos.weight.requires_grad_(False)
    return reference_losses(global_batch, STEPS, model=model), model


def trained(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture
def added() -> Iterator[None]:
    """The transform's module imported as a user's script would import it; taken out again afterwards."""
    from overdrive.transforms import remove_step

    sys.modules.pop(MODULE, None)
    importlib.import_module(MODULE)
    yield
    remove_step("freeze_embeddings")
    sys.modules.pop(MODULE, None)


def test_importing_the_module_puts_its_step_after_activation_checkpointing(added: None):
    from overdrive.transforms import STEPS as BUILT_IN
    from overdrive.transforms import step_names

    assert step_names() == (*BUILT_IN[:5], "freeze_embeddings", *BUILT_IN[5:])


def test_the_single_strategy_runs_it_and_matches_plain_pytorch(added: None):
    from overdrive import Accelerator, GradientState

    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    assert accelerator.strategy.name == "single"
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


def _ddp() -> dict[str, Any]:
    import tests.transforms.freeze_embeddings  # noqa: F401 - the recipe: importing the module adds the step
    from overdrive import Accelerator

    accelerator = Accelerator()
    out = accelerated_losses(accelerator, 4, STEPS)  # 4 per rank: the reference's batch of 8
    model = accelerator.unwrap_model(out["model"])
    return {"strategy": accelerator.strategy.name, "losses": out["losses"], "params": trained(model),
            "wrapped": type(out["model"]).__name__}


@pytest.mark.multiprocess
def test_ddp_on_two_processes_runs_it_before_data_parallel_and_matches_plain_pytorch():
    results = run_distributed(_ddp, 2, timeout=180)
    expected, reference = frozen_reference(8)
    initial, theirs = trained(make_model()), trained(reference)
    for found in results:
        assert found["strategy"] == "ddp" and found["wrapped"] == "DistributedDataParallel"
        assert worst(found["losses"], expected) < 1e-5
        assert torch.equal(found["params"]["embed.weight"], initial["embed.weight"])
        assert all(torch.allclose(found["params"][name], theirs[name], atol=1e-5) for name in theirs)


def test_a_strategy_overrides_the_step_by_name(added: None):
    from overdrive import Accelerator
    from overdrive.resolve import SingleSettings
    from overdrive.strategies import create_strategy, register_strategy
    from overdrive.strategies.single import SingleDeviceStrategy
    from overdrive.transforms.path import ModelPath, skip

    class KeepsEmbeddings(SingleDeviceStrategy):
        name = "keeps-embeddings"

        def path_overrides(self):  # noqa: ANN202 - as a user writes it
            return {"freeze_embeddings": skip}

    class FreezesThenCounts(SingleDeviceStrategy):
        name = "freezes-then-counts"
        frozen = 0

        def path_overrides(self):  # noqa: ANN202
            def freeze_embeddings(path: ModelPath, model: nn.Module) -> nn.Module:
                model = path.default("freeze_embeddings")(model)  # the registered step first
                FreezesThenCounts.frozen = sum(not p.requires_grad for p in model.parameters())
                return model

            return {"freeze_embeddings": freeze_embeddings}

    context = Accelerator(cpu=True).strategy.context
    register_strategy(KeepsEmbeddings.name, KeepsEmbeddings)
    register_strategy(FreezesThenCounts.name, FreezesThenCounts)
    kept = create_strategy(KeepsEmbeddings.name, context, SingleSettings()).wrap_model(make_model())
    assert all(p.requires_grad for p in kept.parameters())
    frozen = create_strategy(FreezesThenCounts.name, context, SingleSettings()).wrap_model(make_model())
    assert FreezesThenCounts.frozen == 2 and not frozen.embed.weight.requires_grad


def test_bad_registrations_are_refused_naming_the_choices(added: None):
    from overdrive.transforms import register_step, remove_step

    with pytest.raises(ValueError, match=r"no step 'activation' for 'x' to run after; its steps: placement, "):
        register_step("x", lambda path, model: model, after="activation")
    with pytest.raises(ValueError, match="'compile' is a built-in step of the model path"):
        register_step("compile", lambda path, model: model, after="placement")
    with pytest.raises(TypeError, match="a model path step is a function"):
        register_step("x", "not a function", after="placement")  # type: ignore[arg-type]
    register_step("after_freeze", lambda path, model: model, after="freeze_embeddings")
    try:
        with pytest.raises(ValueError, match="after_freeze run after it; remove them first"):
            remove_step("freeze_embeddings")
    finally:
        remove_step("after_freeze")
    with pytest.raises(ValueError, match="no step 'never' was added with register_step"):
        remove_step("never")
