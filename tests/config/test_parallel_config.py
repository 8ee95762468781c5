"""Parallelism settings in one process: mesh sizes and their errors, the FSDP plugin and its config-dict
form, and the FSDP2 strategy on one process (no sharding, same numbers)."""

from __future__ import annotations

import warnings

import pytest
import torch

from overdrive import Accelerator
from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.runtime.mesh import ParallelDims, ParallelMesh, check_sizes
from tests.support.parallel import accelerated_losses, reference_losses, worst


def test_sizes_must_multiply_to_the_world_and_the_error_prints_both():
    problems = check_sizes({"dp_shard": 2, "tp": 3}, world_size=4)
    assert len(problems) == 1 and "product is 6" in problems[0] and "4 processes" in problems[0]
    with pytest.raises(ValueError, match="product is 6 but there are 4 processes"):
        ParallelDims.from_sizes({"dp_shard": 2, "tp": 3}, 4)


def test_one_minus_one_is_filled_in_and_two_are_refused():
    assert ParallelDims.from_sizes({"dp_replicate": -1, "dp_shard": 2, "tp": 2}, 8) == ParallelDims(
        dp_replicate=2, dp_shard=2, tp=2)
    problems = check_sizes({"dp_shard": -1, "tp": -1}, 4)
    assert any("only one size may be -1" in p for p in problems)
    assert any("does not divide" in p for p in check_sizes({"dp_shard": -1, "tp": 3}, 4))


def test_every_problem_is_reported_at_once():
    problems = check_sizes({"pp": 2, "dp_shard": 0, "tp": "2"}, 4)
    text = "\n".join(problems)
    assert len(problems) == 2 and "dp_shard_size=0" in text and "tp_size='2'" in text
    assert check_sizes({"pp": 2, "dp_shard": 2}, 4) == []  # pipeline parallel is an axis like the others


def test_ranks_along_axes_follow_the_row_major_layout_without_building_a_mesh():
    dims = ParallelDims(dp_replicate=2, dp_shard=2, tp=2)
    places = []
    for rank in range(8):
        mesh = ParallelMesh(dims, "cpu", rank, build=False)
        places.append((mesh.rank("dp_replicate"), mesh.rank("dp_shard"), mesh.rank("tp"), mesh.rank("dp")))
    assert places[5] == (1, 0, 1, 2) and places[3] == (0, 1, 1, 1)
    assert [p[3] for p in places] == [0, 0, 1, 1, 2, 2, 3, 3]  # tensor-parallel peers share a dp index
    assert mesh.size("dp") == 4 and mesh.size("cp") == 1 and mesh.mesh is None


def test_plugin_validates_every_field_at_once():
    with pytest.raises(ValueError) as info:
        FullyShardedDataParallelPlugin(fsdp_version=3, auto_wrap_policy="bogus", state_dict_type="LOCAL",
                                       sharding_strategy="NO_SHARD")
    text = str(info.value)
    for word in ("fsdp_version=3", "auto_wrap_policy='bogus'", "state_dict_type='LOCAL'", "NO_SHARD"):
        assert word in text


def test_plugin_from_accelerate_fsdp_config_keys():
    plugin = FullyShardedDataParallelPlugin.from_config_dict({
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block, LlamaDecoderLayer", "fsdp_offload_params": "false",
        "fsdp_reshard_after_forward": "SHARD_GRAD_OP", "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": "true", "fsdp_activation_checkpointing": False})
    assert plugin.transformer_cls_names_to_wrap == ["Block", "LlamaDecoderLayer"]
    assert plugin.auto_wrap_policy == "transformer_based_wrap" and plugin.cpu_offload is False
    assert plugin.reshard is False and plugin.state_dict_type == "FULL_STATE_DICT"
    assert plugin.cpu_ram_efficient_loading is True
    assert FullyShardedDataParallelPlugin(min_num_params=1000).auto_wrap_policy == "size_based_wrap"
    assert FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD").wants_hybrid_shard
    with pytest.raises(ValueError, match="unknown keys.*fsdp_bogus"):
        FullyShardedDataParallelPlugin.from_config_dict({"fsdp_bogus": 1})


def test_fsdp_version_1_runs_on_fsdp2_with_a_notice_and_one_process_matches_plain_pytorch():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=1, activation_checkpointing=True))
    assert any("fsdp_version=1" in str(w.message) for w in caught)
    assert accelerator.strategy.name == "fsdp2" and accelerator.torch_device_mesh is None
    assert (accelerator.data_parallel_size, accelerator.tensor_parallel_rank, accelerator.context_parallel_size) == (
        1, 0, 1)
    out = accelerated_losses(accelerator, 8, 5, clip=1.0)
    assert worst(out["losses"], reference_losses(8, 5, clip=1.0)) < 1e-5
    accelerator.free_memory()


def test_one_process_bf16_through_the_strategy_uses_autocast_once():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin())
    out = accelerated_losses(accelerator, 8, 3)
    assert worst(out["losses"], reference_losses(8, 3, dtype=torch.bfloat16)) < 1e-4
    assert len(accelerator.hooks) == 2  # one autocast region (pre-hook + hook), in the one registry
    accelerator.free_memory()
