"""resolve_fault_tolerance: what ``--ft_lighthouse`` and its companions resolve to, and the refusals (a bad address,
a strategy other than data parallel or FSDP2 sharding inside a group, a replica group outside the count)."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from overdrive.config import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin
from overdrive.resolve.fault_tolerance import (
    DEFAULT_TIMEOUT_S,
    FaultTolerantSettings,
    resolve_fault_tolerance,
)
from overdrive.runtime.mesh import ParallelDims
from tests.resolve.conftest import cpu_process

needs_torchft = pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="needs torchft")
LIGHTHOUSE = "http://10.0.0.5:29510"


def _resolve(launched: dict, strategy: str = "single", world_size: int = 1, **info):
    errors: list[str] = []
    return resolve_fault_tolerance(launched, cpu_process(world_size, **info), strategy, None, errors), errors


def test_without_a_lighthouse_the_run_is_not_fault_tolerant():
    assert _resolve({}) == (None, []) and _resolve({"ft_lighthouse": ""}) == (None, [])


@needs_torchft
def test_one_machine_is_replica_group_0_of_1_with_the_default_timeout():
    settings, errors = _resolve({"ft_lighthouse": LIGHTHOUSE})
    assert errors == []
    assert settings == FaultTolerantSettings(lighthouse=LIGHTHOUSE, replica_group=0, num_replica_groups=1, store=None,
                                             timeout_s=DEFAULT_TIMEOUT_S, options=DistributedDataParallelKwargs())


@needs_torchft
def test_the_replica_group_follows_the_machine_unless_given():
    settings, _ = _resolve({"ft_lighthouse": LIGHTHOUSE, "machine_rank": 2, "num_machines": 3})
    assert settings is not None and (settings.replica_group, settings.num_replica_groups) == (2, 3)
    settings, _ = _resolve({"ft_lighthouse": LIGHTHOUSE, "machine_rank": 2, "num_machines": 3,
                            "ft_replica_group": 0, "ft_num_replica_groups": 2})
    assert settings is not None and (settings.replica_group, settings.num_replica_groups) == (0, 2)


@needs_torchft
def test_a_group_of_several_processes_names_its_store_reachable_from_other_machines():
    settings, _ = _resolve({"ft_lighthouse": LIGHTHOUSE}, "ddp", 2, master_addr="127.0.0.1", master_port=29600)
    assert settings is not None and settings.store == (socket.gethostname(), 29600)  # not a loopback address
    settings, _ = _resolve({"ft_lighthouse": LIGHTHOUSE}, "ddp", 2, master_addr="10.0.0.7", master_port=29600)
    assert settings is not None and settings.store == ("10.0.0.7", 29600)


@needs_torchft
def test_the_ddp_options_are_copied_into_the_settings():
    options = DistributedDataParallelKwargs(bucket_cap_mb=5)
    errors: list[str] = []
    settings = resolve_fault_tolerance({"ft_lighthouse": LIGHTHOUSE}, cpu_process(), "ddp", options, errors)
    assert settings is not None and settings.options == options and settings.options is not options


@needs_torchft
def test_a_replica_group_outside_the_count_is_refused():
    _, errors = _resolve({"ft_lighthouse": LIGHTHOUSE, "ft_replica_group": 2, "ft_num_replica_groups": 2})
    assert errors == ["ft_replica_group=2 is not below ft_num_replica_groups=2; number the replica groups 0 .. 1 (or "
                      "raise ft_num_replica_groups)"]


@needs_torchft
def test_fsdp2_over_the_group_shards_inside_each_replica_group():
    """FSDP2 over the group's processes: the settings carry a copy of the plugin (the strategy ft_fsdp2); with one
    process there is nothing to shard, and the group runs as data parallel (ft_ddp)."""
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False)
    errors: list[str] = []
    settings = resolve_fault_tolerance({"ft_lighthouse": LIGHTHOUSE}, cpu_process(2), "fsdp2", None, errors,
                                       fsdp=plugin, dims=ParallelDims(dp_shard=2))
    assert errors == [] and settings is not None
    assert settings.fsdp == plugin and settings.fsdp is not plugin
    settings = resolve_fault_tolerance({"ft_lighthouse": LIGHTHOUSE}, cpu_process(), "fsdp2", None, errors,
                                       fsdp=plugin, dims=ParallelDims())
    assert errors == [] and settings is not None and settings.fsdp is None


@pytest.mark.parametrize(("dims", "named"), [(ParallelDims(dp_shard=2, tp=2), "tensor parallel (tp_size) 2"),
                                             (ParallelDims(dp_replicate=2, dp_shard=2),
                                              "replicas inside the group (dp_replicate_size) 2")])
def test_fsdp2_with_other_axes_inside_the_group_is_refused_naming_them(dims, named):
    errors: list[str] = []
    settings = resolve_fault_tolerance({"ft_lighthouse": LIGHTHOUSE}, cpu_process(4), "fsdp2", None, errors,
                                       fsdp=FullyShardedDataParallelPlugin(), dims=dims)
    assert settings is None and len(errors) == 1
    assert errors[0].startswith(f"ft_lighthouse='{LIGHTHOUSE}' with the 'fsdp2' strategy ({named}): ")
    assert "leave out DeepSpeed, pipeline, tensor and context parallel settings and dp_replicate_size" in errors[0]


@pytest.mark.parametrize("strategy", ["deepspeed", "pipeline"])
def test_a_strategy_other_than_data_parallel_or_fsdp2_is_refused_naming_it(strategy):
    settings, errors = _resolve({"ft_lighthouse": LIGHTHOUSE}, strategy)
    assert settings is None and len(errors) == 1
    assert errors[0].startswith(f"ft_lighthouse='{LIGHTHOUSE}' with the '{strategy}' strategy: fault-tolerant "
                                "training runs data parallel (DDP) or FSDP2 sharding over each replica group's")


def test_an_address_that_is_not_a_lighthouse_url_is_refused_naming_it():
    settings, errors = _resolve({"ft_lighthouse": "not a url"})
    assert settings is None and len(errors) == 1 and "'not a url'" in errors[0]
