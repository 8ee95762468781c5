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


def test_every_written_out_value_takes_exactly_its_fields_as_arguments():
    """Each FrozenValue's ``__init__`` names exactly its fields (a field declared but not taken fails at
    construction; one taken but not declared is silently left out of equality, hash and repr)."""
    import inspect

    import overdrive.accelerator  # noqa: F401 - loads the modules that define the start-up's values
    from overdrive.config._frozen import FrozenValue

    def subclasses(cls: type) -> list[type]:
        return [cls, *(sub for direct in cls.__subclasses__() for sub in subclasses(direct))]

    found = {cls.__name__: cls for cls in subclasses(FrozenValue)[1:]}
    assert {"ProcessInfo", "ParallelDims", "PrecisionPolicy", "ProcessPlan", "Parallelism",
            "TrainingPlan"} <= set(found)
    for cls in found.values():
        taken = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        assert sorted(taken) == sorted(cls._fields), cls


def test_start_up_values_keep_the_dataclass_defaults_and_refuse_assignment():
    import torch

    from overdrive.precision.policy import PrecisionPolicy
    from overdrive.resolve.process import ProcessPlan
    from overdrive.runtime.cluster import ProcessInfo
    from overdrive.runtime.mesh import ParallelDims

    info = ProcessInfo()
    assert (info.rank, info.world_size, info.master_addr, info.master_port, info.source) == (
        0, 1, "127.0.0.1", 29500, "single process") and not info.is_distributed
    assert repr(ProcessInfo(rank=1, world_size=2)).startswith("ProcessInfo(rank=1, world_size=2, local_rank=0,")
    dims = ParallelDims(dp_shard=2, tp=2)
    assert dims == ParallelDims.from_sizes({"dp_shard": 2, "tp": 2}, 4) and len({dims, ParallelDims(2, 1)}) == 2
    assert PrecisionPolicy() == PrecisionPolicy("no", None, torch.float32, torch.float32, False)
    plan = ProcessPlan(info, torch.device("cpu"), None)
    assert (plan.timeout, plan.debug, plan.stall_timeout) == (None, False, None)
    for value, name in ((info, "rank"), (dims, "tp"), (PrecisionPolicy(), "name"), (plan, "backend")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, getattr(value, name))
        assert pickle.loads(pickle.dumps(value)) == value
