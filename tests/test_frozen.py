"""The plan's written-out value classes behave as the frozen dataclasses they replace (overdrive/config/_frozen.py)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from overdrive.resolve.plan import DDPSettings, PipelineStrategySettings, TrainingPlan
from overdrive.transforms.settings import CompileSettings, ModelTransforms


def test_frozen_equal_hashable_printable_and_copyable_like_a_frozen_dataclass():
    @dataclasses.dataclass(frozen=True)
    class Reference:
        backend: str = "inductor"
        mode: str | None = None
        fullgraph: bool = False
        dynamic: bool | None = None
        options: dict | None = None
        disable: bool = False
        regional: bool = False

    ours, theirs = CompileSettings(mode="max-autotune"), Reference(mode="max-autotune")
    assert repr(ours) == repr(theirs).replace(Reference.__qualname__, "CompileSettings")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.mode = "default"  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ours.mode
    assert ours == CompileSettings(mode="max-autotune") and ours != CompileSettings() and ours != theirs
    assert hash(ours) == hash(CompileSettings(mode="max-autotune")) and len({ours, CompileSettings(mode="max-autotune")}) == 1
    for copied in (copy.copy(ours), copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert copied == ours and copied is not ours
    with pytest.raises(TypeError):
        DDPSettings(bucket_cap=10)  # type: ignore[call-arg]


def test_defaults_are_fresh_objects_as_default_factory_made_them():
    first, second = ModelTransforms(), ModelTransforms()
    assert first.fsdp is not second.fsdp and first.precision is not second.precision
    plan = TrainingPlan("single", first.precision, *_two_configs())
    assert plan.ddp is not TrainingPlan("single", first.precision, *_two_configs()).ddp
    assert plan._fields[:4] == ("strategy", "precision", "accumulation", "dataloader") and len(plan._fields) == 22
    settings = PipelineStrategySettings("GPipe", 4, 1, "ddp", DDPSettings())
    assert settings.balance == "layers" and settings.output_pp_rank == 0


def _two_configs() -> tuple:
    from overdrive.config import DataLoaderConfiguration, GradientAccumulationPlugin

    return GradientAccumulationPlugin(num_steps=1), DataLoaderConfiguration()
