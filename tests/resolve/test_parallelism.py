"""resolve_parallelism and strategy_settings: the strategy and mesh sizes chosen from the plugins and the
parallelism config, each strategy's settings, and the combinations refused with advice."""

from __future__ import annotations

import pytest

from overdrive.config import (
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    TorchTensorParallelPlugin,
)
from overdrive.resolve.parallelism import (
    Parallelism,
    launched_parallelism,
    resolve_parallelism,
    strategy_settings,
)
from overdrive.resolve.plan import DDPSettings, SingleSettings
from overdrive.resolve.sharded_settings import FSDP2Settings, PipelineStrategySettings
from overdrive.runtime.mesh import ParallelDims
from tests.resolve.conftest import cpu_process


def _resolve(world_size: int = 1, fsdp: FullyShardedDataParallelPlugin | None = None,
             config: ParallelismConfig | None = None, tp: TorchTensorParallelPlugin | None = None,
             local_world_size: int | None = None) -> tuple[Parallelism, list[str]]:
    errors: list[str] = []
    chosen = resolve_parallelism(cpu_process(world_size, local_world_size), fsdp, config, tp, errors)
    return chosen, errors


def test_one_process_without_plugins_is_single_and_builds_no_mesh():
    chosen, errors = _resolve(1)
    assert (chosen.strategy, chosen.dims, chosen.uses_mesh, errors) == ("single", ParallelDims(), False, [])


def test_several_processes_without_plugins_replicate_with_ddp():
    chosen, errors = _resolve(4)
    assert (chosen.strategy, chosen.dims, chosen.uses_mesh, errors) == ("ddp", ParallelDims(dp_replicate=4), False, [])


def test_a_replicate_only_parallelism_config_is_ddp_over_a_mesh():
    chosen, errors = _resolve(4, config=ParallelismConfig(dp_replicate_size=4))
    assert (chosen.strategy, chosen.uses_mesh, errors) == ("ddp", True, [])


def test_sharding_with_tensor_parallel_is_fsdp2_over_both_axes():
    chosen, errors = _resolve(4, config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    assert (chosen.strategy, chosen.dims, errors) == ("fsdp2", ParallelDims(dp_shard=2, tp=2), [])


def test_a_tensor_parallel_plugin_alone_shards_the_rest_of_the_world():
    chosen, errors = _resolve(4, tp=TorchTensorParallelPlugin(tp_size=2))
    assert (chosen.dims, errors) == (ParallelDims(dp_shard=2, tp=2), [])
    assert chosen.tp is not None and chosen.tp.tp_size == 2


def test_an_fsdp_plugin_alone_shards_over_every_process():
    chosen, errors = _resolve(4, fsdp=FullyShardedDataParallelPlugin())
    assert (chosen.strategy, chosen.dims, chosen.uses_mesh, errors) == ("fsdp2", ParallelDims(dp_shard=4), True, [])


def test_hybrid_shard_shards_within_a_machine_and_replicates_across():
    hybrid = FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")
    chosen, errors = _resolve(4, fsdp=hybrid, local_world_size=2)
    assert (chosen.strategy, chosen.dims, errors) == ("fsdp2", ParallelDims(dp_replicate=2, dp_shard=2), [])


def test_fsdp_version_1_warns_that_fsdp2_runs():
    with pytest.warns(UserWarning, match="fsdp_version=1 requested: overdrive runs FSDP2"):
        _resolve(2, fsdp=FullyShardedDataParallelPlugin(fsdp_version=1))


def test_sizes_whose_product_is_not_the_world_are_refused_with_the_product():
    chosen, errors = _resolve(4, config=ParallelismConfig(dp_shard_size=2, tp_size=4))
    assert any("the product is 8 but there are 4 processes" in e for e in errors), errors
    assert chosen.dims == ParallelDims()


def test_replicated_data_parallel_over_tensor_parallel_is_refused_with_advice():
    _, errors = _resolve(4, config=ParallelismConfig(dp_replicate_size=2, tp_size=2))
    assert errors == ["dp_replicate_size=2 with tp_size=2 needs dp_shard_size > 1: replicated data parallel over a "
                      "tensor-parallel model is done by HSDP; use dp_shard_size"]


def test_an_fsdp_plugin_that_shards_nothing_is_refused():
    _, errors = _resolve(2, fsdp=FullyShardedDataParallelPlugin(), config=ParallelismConfig(dp_replicate_size=2))
    assert len(errors) == 1 and "fsdp_plugin was given but nothing is sharded" in errors[0]
    assert "dp_shard_size > 1" in errors[0]


def test_a_device_mesh_in_the_tensor_parallel_plugin_is_refused():
    plugin = TorchTensorParallelPlugin(tp_size=1)
    plugin.torch_device_mesh = object()  # type: ignore[assignment]
    _, errors = _resolve(1, tp=plugin)
    assert errors == ["TorchTensorParallelPlugin(torch_device_mesh=...) is not used: overdrive builds the mesh; give "
                      "the sizes with ParallelismConfig(tp_size=..., dp_shard_size=...)"]


@pytest.mark.parametrize(("config", "words"), [
    (ParallelismConfig(cp_backend="ring"), ["cp_backend='ring' is not valid", "'torch'"]),
    (ParallelismConfig(sp_backend="ulysses"), ["sp_backend='ulysses' is not valid", "'deepspeed'"]),
    (ParallelismConfig(sp_size=2), ["sp_size=2", "not supported", "cp_size"]),
    (ParallelismConfig(cp_size=2), ["cp_size=2 asks for context parallelism, which needs CUDA"]),
    (ParallelismConfig(cp_handler={"cp_comm_strategy": "ring"}), ["cp_comm_strategy='ring' is not valid", "allgather"]),
])
def test_context_and_sequence_parallel_settings_it_cannot_run_are_named(config, words):
    _, errors = _resolve(2 if config.cp_size == 2 else 1, config=config)
    text = "\n".join(errors)
    for word in words:
        assert word in text, text


def test_a_pipeline_size_makes_the_pipeline_strategy_with_its_stage_strategy():
    chosen, errors = _resolve(4, config=ParallelismConfig(pp_size=2, dp_replicate_size=2))
    assert (chosen.strategy, chosen.stage_strategy, errors) == ("pipeline", "ddp", [])
    assert chosen.dims == ParallelDims(dp_replicate=2, pp=2) and chosen.pipeline is not None
    chosen, errors = _resolve(2, config=ParallelismConfig(pp_size=2))
    assert (chosen.strategy, chosen.stage_strategy, errors) == ("pipeline", "single", [])


def test_pipeline_settings_with_an_unknown_field_are_refused_naming_the_fields():
    _, errors = _resolve(2, config=ParallelismConfig(pp_size=2, pp_handler={"micro_batches": 4}))
    assert len(errors) == 1 and "pp_handler={'micro_batches': 4}" in errors[0]
    assert "num_microbatches" in errors[0]  # one of the fields it has


def test_cpu_ram_efficient_loading_is_refused_with_a_pipeline():
    fsdp = FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    _, errors = _resolve(4, fsdp=fsdp, config=ParallelismConfig(pp_size=2, dp_shard_size=2))
    assert any("cpu_ram_efficient_loading=True is not supported with pp_size > 1" in e for e in errors), errors


def test_the_launch_configs_fsdp_and_sizes_apply_unless_the_script_gave_its_own():
    launched = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False},
                "parallelism_config": {"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2}}
    fsdp, config = launched_parallelism(launched, None, None)
    assert fsdp is not None and fsdp.reshard_after_forward is False
    assert config is not None and (config.dp_shard_size, config.tp_size) == (2, 2)
    mine_fsdp, mine_config = FullyShardedDataParallelPlugin(), ParallelismConfig(dp_shard_size=4)
    assert launched_parallelism(launched, mine_fsdp, mine_config) == (mine_fsdp, mine_config)
    assert launched_parallelism({}, None, None) == (None, None)


def test_each_strategy_gets_its_own_settings_with_copies_of_the_plugins():
    ddp_options = DistributedDataParallelKwargs(bucket_cap_mb=10)
    assert strategy_settings(_resolve(1)[0], None) == SingleSettings()
    ddp = strategy_settings(_resolve(2)[0], ddp_options)
    assert isinstance(ddp, DDPSettings) and ddp.options == ddp_options and ddp.options is not ddp_options
    assert strategy_settings(_resolve(2)[0], None) == DDPSettings(DistributedDataParallelKwargs())
    fsdp_plugin = FullyShardedDataParallelPlugin(reshard_after_forward=False)
    fsdp = strategy_settings(_resolve(2, fsdp=fsdp_plugin)[0], None)
    assert isinstance(fsdp, FSDP2Settings) and fsdp.fsdp == fsdp_plugin and fsdp.fsdp is not fsdp_plugin


def test_a_pipelines_settings_hold_the_schedule_and_the_stage_strategys_settings():
    fsdp = FullyShardedDataParallelPlugin()
    chosen, _ = _resolve(4, fsdp=fsdp, config=ParallelismConfig(pp_size=2, dp_shard_size=2))
    settings = strategy_settings(chosen, None)
    assert isinstance(settings, PipelineStrategySettings)
    assert (settings.stage_strategy, settings.stages_per_rank) == ("fsdp2", 1)
    assert settings.num_microbatches == 2 and settings.output_pp_rank == 1  # one micro-batch per stage; last rank
    # the pipeline broadcasts each stage itself, so the stage strategy must not
    assert isinstance(settings.stage_settings, FSDP2Settings) and settings.stage_settings.fsdp.sync_module_states is False
    assert settings.sync_module_states is True
