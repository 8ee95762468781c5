"""``ParallelismConfig.build_device_mesh`` and the ``PARALLELISM_CONFIG_*`` variables, compared with the real
Accelerate's ``ParallelismConfig`` on the same 4-process gloo group (each imported in its own run, no alias):
the same mesh, the same flattened joint axes (``dp``, ``dp_shard_cp``, ``dp_cp``) and the same sizes read from
the environment. Accelerate's suite checks the same with a mocked ``init_device_mesh``
(tests/test_dataclasses.py::TestParallelismConfig)."""

from __future__ import annotations

import importlib

import pytest
import torch

from overdrive.config import ParallelismConfig
from tests.support.distributed import run_distributed

_LAUNCHED = {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
             "PARALLELISM_CONFIG_TP_SIZE": "2", "PARALLELISM_CONFIG_CP_SIZE": "1"}


def _mesh_of(module_name: str) -> dict:
    torch.distributed.init_process_group("gloo")
    config_class = importlib.import_module(module_name).ParallelismConfig
    config = config_class()  # every size from the PARALLELISM_CONFIG_* variables
    mesh = config.build_device_mesh("cpu")
    out = {"sizes": [config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size],
            "names": list(mesh.mesh_dim_names), "mesh": mesh.mesh.tolist(),
            "joint": {name: mesh[name].mesh.tolist() for name in ("dp", "dp_shard_cp", "dp_cp")},
            "tp_group": mesh["tp"].mesh.tolist()}
    torch.distributed.barrier()  # rank 0 holds the store: it leaves only once every rank made its groups
    return out


@pytest.mark.timeout(240)
@pytest.mark.requires("accelerate")
def test_build_device_mesh_from_launched_variables_matches_accelerate():
    ours = run_distributed(_mesh_of, 4, "overdrive.config", env=_LAUNCHED, timeout=180)
    theirs = run_distributed(_mesh_of, 4, "accelerate.parallelism_config", env=_LAUNCHED, timeout=180)
    assert ours == theirs
    assert ours[0]["sizes"] == [1, 2, 2, 1] and ours[0]["names"] == ["dp_shard", "tp"]
    assert ours[3]["joint"]["dp"] == [1, 3] and ours[3]["tp_group"] == [2, 3]


def test_sizes_left_out_read_the_launched_variables(monkeypatch):
    for name, value in _LAUNCHED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig(cp_size=2)
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (1, 2, 2, 2)
    assert config.cp_handler.cp_comm_strategy == "alltoall"
    assert config._get_mesh() == (("dp_shard", "cp", "tp"), (2, 2, 2))
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"] and config.total_size == 8
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        ParallelismConfig(cp_size=2)
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ValueError, match="PARALLELISM_CONFIG_TP_SIZE='two'"):
        ParallelismConfig()


def test_without_variables_every_size_is_one(monkeypatch):
    for name in _LAUNCHED:
        monkeypatch.delenv(name, raising=False)
    config = ParallelismConfig()
    assert config.sizes() == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1}
    assert config.build_device_mesh("cpu") is None and config.active_mesh_dims == []
