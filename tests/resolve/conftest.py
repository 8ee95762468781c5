"""Helpers of the resolver's unit tests: a process plan for any world size (no process group is started), and a
clean environment (no launcher's or Accelerate's variables leak in from the shell running the tests)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from overdrive.resolve.process import ProcessPlan
from overdrive.runtime.cluster import ProcessInfo

LEAKING = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "GROUP_", "ROLE_", "NODE_RANK", "OVERDRIVE_", "ACCELERATE_",
           "TORCHELASTIC_", "TORCH_DISTRIBUTED_DEBUG", "SLURM_", "OMPI_", "PMI_", "MV2_", "FSDP_",
           "PARALLELISM_CONFIG_")


def cpu_process(world_size: int = 1, local_world_size: int | None = None, **info: Any) -> ProcessPlan:
    """A CPU process of a job of ``world_size`` processes, as the resolver's later steps receive it."""
    local = world_size if local_world_size is None else local_world_size
    place = ProcessInfo(world_size=world_size, local_world_size=local, **info)
    return ProcessPlan(info=place, device=torch.device("cpu"), backend="gloo" if world_size > 1 else None)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(LEAKING):
            monkeypatch.delenv(name)
    return monkeypatch
