"""resolve_parallelism: the strategy and mesh sizes chosen from the plugins and the parallelism config, and the
combinations it refuses with advice."""

from __future__ import annotations

from overdrive.config import FullyShardedDataParallelPlugin, ParallelismConfig, TorchTensorParallelPlugin
from overdrive.resolve import resolve_parallelism, resolve_process
from overdrive.runtime.mesh import ParallelDims


def test_replicated_data_parallel_over_tensor_parallel_is_refused_with_advice():
    process = resolve_process(cpu=True)
    object.__setattr__(process, "info", type(process.info)(world_size=4))
    errors: list[str] = []
    resolve_parallelism(process, None, ParallelismConfig(dp_replicate_size=2, tp_size=2), None, errors)
    assert any("needs dp_shard_size > 1" in e for e in errors)
    errors = []
    chosen = resolve_parallelism(process, None, ParallelismConfig(dp_shard_size=2, tp_size=2), None, errors)
    assert not errors and chosen.strategy == "fsdp2" and chosen.dims == ParallelDims(dp_shard=2, tp=2)
    chosen = resolve_parallelism(process, None, ParallelismConfig(dp_replicate_size=4), None, errors)
    assert chosen.strategy == "ddp" and chosen.uses_mesh
    chosen = resolve_parallelism(process, None, None, TorchTensorParallelPlugin(tp_size=2), errors)
    assert chosen.dims == ParallelDims(dp_shard=2, tp=2) and not errors
    object.__setattr__(process, "info", type(process.info)(world_size=4, local_world_size=2))
    hybrid = FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")
    chosen = resolve_parallelism(process, hybrid, None, None, errors)  # shard within a machine, replicate across
    assert chosen.dims == ParallelDims(dp_replicate=2, dp_shard=2) and chosen.strategy == "fsdp2" and not errors
