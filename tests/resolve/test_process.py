"""resolve_process: where this process runs, from the launcher's variables, the launch config and the
``InitProcessGroupKwargs`` given (no process group is started here)."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
import torch

from overdrive.config import DistributedType, InitProcessGroupKwargs
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR
from overdrive.resolve.process import resolve_process
from tests.resolve.conftest import cpu_process

TORCHRUN_2 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "29511"}
needs_no_accelerator = pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the CPU-only machine")


def _set(env: pytest.MonkeyPatch, variables: dict[str, str], launched: dict | None = None) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    if launched is not None:
        env.setenv(LAUNCH_CONFIG_VAR, json.dumps(launched))


@needs_no_accelerator
def test_started_alone_it_is_one_cpu_process_without_a_backend(clean_env):
    plan = resolve_process()
    assert (plan.info.world_size, plan.info.rank, plan.device, plan.backend) == (1, 0, torch.device("cpu"), None)
    assert (plan.timeout, plan.debug, plan.stall_timeout) == (None, False, None)
    assert plan.distributed_type == DistributedType.NO


def test_torchruns_variables_with_the_cpu_setting_make_a_gloo_world(clean_env):
    _set(clean_env, TORCHRUN_2)
    plan = resolve_process(cpu=True)
    assert (plan.info.rank, plan.info.world_size, plan.info.local_rank, plan.info.master_port) == (1, 2, 1, 29511)
    assert plan.info.source == "environment (RANK/WORLD_SIZE)"
    assert plan.backend == "gloo" and plan.device == torch.device("cpu")
    assert plan.distributed_type == DistributedType.MULTI_CPU


@needs_no_accelerator
def test_without_a_gpu_and_without_the_cpu_setting_each_process_trains_alone(clean_env, capsys):
    _set(clean_env, {**TORCHRUN_2, "RANK": "0", "LOCAL_RANK": "0"})
    plan = resolve_process()
    assert plan.info.world_size == 1 and "alone" in plan.info.source
    assert "each trains alone" in capsys.readouterr().err  # rank 0 says so once


def test_the_launch_configs_cpu_setting_counts_as_cpu_true(clean_env):
    _set(clean_env, TORCHRUN_2, {"cpu": True})
    assert resolve_process().info.world_size == 2


def test_timeout_and_stall_timeout_come_from_the_launch_config(clean_env):
    _set(clean_env, {}, {"timeout": "30", "stall_timeout": "12.5", "debug": True})
    plan = resolve_process(cpu=True)
    assert plan.timeout == timedelta(seconds=30) and plan.stall_timeout == 12.5 and plan.debug


def test_init_process_group_kwargs_win_over_the_launch_config(clean_env):
    _set(clean_env, TORCHRUN_2, {"timeout": "30"})
    plan = resolve_process(cpu=True, init_kwargs=InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=5)))
    assert plan.timeout == timedelta(seconds=5) and plan.backend == "gloo"


def test_torch_distributed_debug_detail_turns_debug_on(clean_env):
    clean_env.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert resolve_process(cpu=True).debug


def test_accelerates_torch_device_variable_chooses_the_device(clean_env):
    clean_env.setenv("ACCELERATE_TORCH_DEVICE", "meta")
    assert resolve_process().device == torch.device("meta")


def test_a_world_size_that_is_not_a_number_is_refused_naming_the_variable(clean_env):
    _set(clean_env, {**TORCHRUN_2, "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' is not an integer"):
        resolve_process(cpu=True)


def test_a_rank_outside_the_world_is_refused(clean_env):
    _set(clean_env, {**TORCHRUN_2, "RANK": "2"})
    with pytest.raises(ValueError, match=r"rank 2 is outside the world of 2 processes; ranks run 0\.\.1"):
        resolve_process(cpu=True)


def test_a_plan_is_a_frozen_value():
    plan = cpu_process(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(plan, "backend", "nccl")  # noqa: B010 - the assignment a type checker refuses, tried at run time
    assert plan == cpu_process(2) and plan != cpu_process(4)
