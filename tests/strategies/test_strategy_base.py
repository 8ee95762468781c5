"""Typed seams: every strategy is a ``StrategyBase`` whose capabilities are plain attributes, and the model
path is an object with named steps that a strategy overrides by name (which strategy overrides which is
checked here; the steps' effects are checked against plain PyTorch in tests/transforms/test_model_path.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from overdrive import Accelerator
from overdrive.resolve import DDPSettings, FSDP2Settings, SingleSettings
from overdrive.strategies import StrategyBase, create_strategy, register_strategy
from overdrive.strategies.deepspeed import DeepSpeedSettings
from overdrive.strategies.single import SingleDeviceStrategy
from overdrive.transforms.path import STEPS, ModelPath
from tests.support.parallel import make_model


def overridden(strategy: StrategyBase) -> set[str]:
    return set(strategy.model_path().overrides)


def test_each_strategy_overrides_its_steps_by_name_and_nothing_else():
    from overdrive import FullyShardedDataParallelPlugin

    context = Accelerator(cpu=True).strategy.context
    assert STEPS == ("placement", "precision_hooks", "fp8", "parallelize", "activation_checkpointing", "compile",
                     "data_parallel")
    assert overridden(create_strategy("single", context, SingleSettings())) == set()
    assert overridden(create_strategy("ddp", context, DDPSettings())) == {"data_parallel"}
    # one process: nothing is sharded, so autocast hooks stay and fully_shard does not run
    fsdp = create_strategy("fsdp2", context, FSDP2Settings())
    assert overridden(fsdp) == {"placement", "parallelize"}
    engine = create_strategy("deepspeed", context, DeepSpeedSettings(plugins={}))
    assert overridden(engine) == {"placement", "precision_hooks", "fp8", "data_parallel"}
    assert engine.owns_backward and not fsdp.owns_backward
    assert Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin()).strategy.name == "fsdp2"


def test_capabilities_are_attributes_with_defaults():
    accelerator = Accelerator(cpu=True)
    single, ddp = accelerator.strategy, create_strategy("ddp", accelerator.strategy.context, DDPSettings())
    model = nn.Linear(2, 2)
    assert single.no_sync_does_nothing and not ddp.no_sync_does_nothing
    assert single.distributed_type is None and single.engine_checkpoint is None and not single.owns_backward
    assert single.unwrap_model(model) is model and single.prepare_together([model]) == [model]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert single.prepare_optimizer(optimizer, [model]) is optimizer


def test_an_unknown_step_or_strategy_class_is_refused_naming_the_choices():
    path = Accelerator(cpu=True).strategy.model_path()
    with pytest.raises(ValueError, match=r"no step 'shard'; its steps: placement, precision_hooks, fp8, "):
        path.override("shard", lambda path, model: model)

    class NotAStrategy:
        pass

    with pytest.raises(TypeError, match="a strategy is a subclass of overdrive.strategies.StrategyBase"):
        register_strategy("nope", NotAStrategy)  # type: ignore[arg-type]


class FrozenEmbeddings(SingleDeviceStrategy):
    """A strategy that adds one transform by overriding one step by name: the embeddings stop training."""

    name = "frozen-embeddings"

    def path_overrides(self):  # noqa: ANN201 - the recipe as a user writes it
        def parallelize(path: ModelPath, model: nn.Module) -> nn.Module:
            model = path.parallelize(model)  # the default step first
            for module in model.modules():
                if isinstance(module, nn.Embedding):
                    module.weight.requires_grad_(False)
            return model

        return {"parallelize": parallelize}


def test_a_strategy_overrides_one_step_and_keeps_every_other():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    register_strategy(FrozenEmbeddings.name, FrozenEmbeddings)
    strategy = create_strategy(FrozenEmbeddings.name, accelerator.strategy.context, SingleSettings())
    model = strategy.wrap_model(make_model())
    assert not model.embed.weight.requires_grad and model.head.weight.requires_grad
    assert len(accelerator.hooks) == 2  # the default precision_hooks step still ran (autocast in and out)
    ids = torch.randint(0, 64, (2, 8))
    assert model(ids).dtype == torch.float32  # outputs back in fp32 from the autocast region


def test_the_plan_and_the_context_are_typed_and_init_handler_is_the_one_given():
    from datetime import timedelta

    from overdrive import InitProcessGroupKwargs

    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=77))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    assert accelerator.init_handler is accelerator.plan.init_kwargs
    assert accelerator.init_handler.timeout == timedelta(seconds=77)
    assert Accelerator(cpu=True).init_handler is None
    assert isinstance(accelerator.plan.strategy_settings, SingleSettings)
    fields = {field.name: str(field.type) for field in dataclasses.fields(accelerator.plan)}
    assert "Any" not in fields["strategy_settings"] and "Any" not in fields["init_kwargs"]
    assert "Any" not in fields["deepspeed"]
