"""Typed seams: every strategy is a ``StrategyBase`` whose capabilities are plain attributes, and whose model
path is its own ``wrap_model``, a list of ``apply_*`` calls (their effects are checked against plain PyTorch
in tests/transforms/test_model_path.py); a transform joins it by a subclass."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from overdrive import Accelerator
from overdrive.resolve import DDPSettings, FSDP2Settings, SingleSettings
from overdrive.strategies import StrategyBase, StrategyContext, create_strategy, register_strategy
from overdrive.strategies.deepspeed import DeepSpeedSettings
from overdrive.strategies.single import SingleDeviceStrategy
from tests.support.parallel import make_model


def test_each_strategy_runs_its_own_model_path_and_reports_its_hooks():
    from overdrive import FullyShardedDataParallelPlugin

    context = Accelerator(cpu=True, mixed_precision="bf16").strategy.context
    for strategy in (create_strategy("single", context, SingleSettings()),
                     create_strategy("fsdp2", context, FSDP2Settings())):  # one process: nothing sharded
        handles: list = []
        model = strategy.wrap_model(make_model(), hooks=handles)
        assert len(handles) == 2 and model(torch.randint(0, 64, (2, 8))).dtype == torch.float32, strategy.name
        for handle in handles:
            handle.remove()
    fsdp = create_strategy("fsdp2", context, FSDP2Settings())
    assert fsdp.places_model(False) and not create_strategy("single", context, SingleSettings()).places_model(False)
    engine = create_strategy("deepspeed", context, DeepSpeedSettings(plugins={}))
    assert engine.owns_backward and not fsdp.owns_backward
    assert Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin()).strategy.name == "fsdp2"
    with pytest.raises(NotImplementedError, match="StrategyBase has no model path: a strategy defines wrap_model"):
        StrategyBase(context, None).wrap_model(make_model(), hooks=[])


def test_the_context_is_a_frozen_dataclass_with_a_fresh_fp8_table_each():
    parts = {"device": None, "mesh": None, "precision": None, "transforms": None, "window": None}
    first, second = StrategyContext(**parts), StrategyContext(**parts)  # type: ignore[arg-type]
    assert first.fp8_replaced == {} and first.fp8_replaced is not second.fp8_replaced
    assert first.plugin_selection is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.device = torch.device("cpu")  # type: ignore[misc]


def test_capabilities_are_attributes_with_defaults():
    accelerator = Accelerator(cpu=True)
    single, ddp = accelerator.strategy, create_strategy("ddp", accelerator.strategy.context, DDPSettings())
    model = nn.Linear(2, 2)
    assert single.no_sync_does_nothing and not ddp.no_sync_does_nothing
    assert single.distributed_type is None and single.engine_checkpoint is None and not single.owns_backward
    assert single.unwrap_model(model) is model and single.prepare_together([model]) == [model]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert single.prepare_optimizer(optimizer, [model]) is optimizer


def test_a_strategy_class_that_is_not_one_is_refused():
    class NotAStrategy:
        pass

    with pytest.raises(TypeError, match="a strategy is a subclass of overdrive.strategies.StrategyBase"):
        register_strategy("nope", NotAStrategy)  # type: ignore[arg-type]


class FrozenEmbeddings(SingleDeviceStrategy):
    """A strategy that adds one transform by extending the steps every strategy shares: the embeddings stop
    training."""

    name = "frozen-embeddings"

    def apply_model_transforms(self, model: nn.Module) -> list[nn.Module]:
        blocks = super().apply_model_transforms(model)  # the shared steps first
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.requires_grad_(False)
        return blocks


def test_a_strategy_extends_the_shared_steps_and_keeps_every_other():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    register_strategy(FrozenEmbeddings.name, FrozenEmbeddings)
    strategy = create_strategy(FrozenEmbeddings.name, accelerator.strategy.context, SingleSettings())
    handles: list = []
    model = strategy.wrap_model(make_model(), hooks=handles)
    assert not model.embed.weight.requires_grad and model.head.weight.requires_grad
    assert len(handles) == 2  # the precision hooks still went on (autocast in and out)
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
