"""The resolver's parallelism step: which strategy a run uses, the mesh sizes, the pipeline settings, and
the chosen strategy's typed settings."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from overdrive.config import DistributedDataParallelKwargs, field_names
from overdrive.resolve.plan import DDPSettings, SingleSettings
from overdrive.resolve.process import ProcessPlan
from overdrive.runtime.mesh import ParallelDims, check_sizes, fill_sizes

if TYPE_CHECKING:
    from overdrive.config import (
        FullyShardedDataParallelPlugin,
        ParallelismConfig,
        PipelineConfig,
        TorchTensorParallelPlugin,
    )
    from overdrive.resolve.plan import StrategySettings
    from overdrive.resolve.sharded_settings import StageSettings


@dataclass(frozen=True, slots=True, eq=False)
class Parallelism:
    """What the parallelism step decided: the strategy, the mesh sizes, the plugins behind them, the pipeline
    settings (with pp > 1) and the strategy that wraps each pipeline stage."""

    strategy: str
    dims: ParallelDims
    uses_mesh: bool
    fsdp: FullyShardedDataParallelPlugin | None
    tp: TorchTensorParallelPlugin | None
    cp_comm_strategy: str
    pipeline: PipelineConfig | None = None
    stage_strategy: str | None = None


def resolve_parallelism(process: ProcessPlan, fsdp_plugin: FullyShardedDataParallelPlugin | None,
                        parallelism_config: ParallelismConfig | None, tp_plugin: TorchTensorParallelPlugin | None,
                        errors: list[str]) -> Parallelism:
    """The strategy and mesh sizes for the plugins given; problems are appended to ``errors``."""
    info = process.info
    tp_plugin = tp_plugin or (parallelism_config.tp_handler if parallelism_config else None)
    if fsdp_plugin is not None and fsdp_plugin.fsdp_version == 1:
        warnings.warn("fsdp_version=1 requested: overdrive runs FSDP2 (fully_shard) with the same settings",
                      stacklevel=4)
    if parallelism_config is not None:
        sizes = parallelism_config.sizes()
    elif fsdp_plugin is not None and fsdp_plugin.wants_hybrid_shard:
        sizes = {"dp_replicate": -1, "dp_shard": info.local_world_size}  # shard within a machine
    elif fsdp_plugin is not None or tp_plugin is not None:
        sizes = {"dp_shard": -1, "tp": tp_plugin.tp_size if tp_plugin else 1}
    else:
        sizes = {"dp_replicate": info.world_size}
    problems = check_sizes(sizes, info.world_size)
    errors.extend(problems)
    dims = ParallelDims() if problems else ParallelDims(**fill_sizes(sizes, info.world_size))
    cp_comm = "allgather"  # context parallelism's default; only a ParallelismConfig can ask for it
    if parallelism_config is not None:
        # lazy: loaded for a parallelism config only: a plain start does not load the transforms it names
        from overdrive.transforms.context_parallel import comm_strategy_of, context_parallel_problem

        errors.extend(_unsupported_backends(parallelism_config))
        cp_comm = comm_strategy_of(parallelism_config.cp_handler)
        cp_size = sizes.get("cp", 1)
        problem = context_parallel_problem(cp_size if isinstance(cp_size, int) else 1, process.device, cp_comm)
        if problem:
            errors.append(problem)
    if tp_plugin is not None and tp_plugin.torch_device_mesh is not None:
        errors.append("TorchTensorParallelPlugin(torch_device_mesh=...) is not used: overdrive builds the mesh; give "
                      "the sizes with ParallelismConfig(tp_size=..., dp_shard_size=...)")
    if dims.dp_replicate > 1 and dims.tp > 1 and not dims.shards_parameters:
        errors.append(f"dp_replicate_size={dims.dp_replicate} with tp_size={dims.tp} needs dp_shard_size > 1: "
                      "replicated data parallel over a tensor-parallel model is done by HSDP; use dp_shard_size")
    if fsdp_plugin is not None and info.world_size > 1 and not dims.shards_parameters:
        errors.append(f"fsdp_plugin was given but nothing is sharded ({dims.describe()}); give dp_shard_size > 1 in "
                      "ParallelismConfig, or leave fsdp_plugin out for plain data parallel")
    uses_mesh = fsdp_plugin is not None or parallelism_config is not None or tp_plugin is not None
    stage_axes = tuple(a for a in dims.enabled_axes if a != "pp")
    if not uses_mesh or (stage_axes in ((), ("dp_replicate",)) and fsdp_plugin is None):
        strategy = "ddp" if (info.is_distributed if dims.pp == 1 else info.world_size > dims.pp) else "single"
    else:
        strategy = "fsdp2"
    pp_size = sizes.get("pp", 1)
    pp_size = dims.pp if not problems else pp_size if isinstance(pp_size, int) and pp_size > 1 else 1
    pipeline = _pipeline_config(parallelism_config, fsdp_plugin, pp_size, errors) if pp_size > 1 else None
    if pipeline is not None:
        return Parallelism("pipeline", dims, uses_mesh, fsdp_plugin, tp_plugin, cp_comm, pipeline, strategy)
    return Parallelism(strategy, dims, uses_mesh, fsdp_plugin, tp_plugin, cp_comm)


def _unsupported_backends(config: ParallelismConfig) -> list[str]:
    """Accelerate's context- and sequence-parallel back ends that overdrive does not run."""
    found = []
    if config.cp_backend != "torch":
        found.append(f"cp_backend={config.cp_backend!r} is not valid; the one context-parallel back end is 'torch'")
    if config.sp_backend != "deepspeed":
        found.append(f"sp_backend={config.sp_backend!r} is not valid; Accelerate's one choice is 'deepspeed'")
    elif config.sp_size != 1:
        found.append(f"sp_size={config.sp_size}: DeepSpeed Ulysses sequence parallelism is not supported by overdrive; "
                     "split sequences across processes with cp_size (context parallelism, on GPUs) instead")
    return found


def _pipeline_config(parallelism_config: ParallelismConfig | None, fsdp_plugin: FullyShardedDataParallelPlugin | None,
                     pp_size: int, errors: list[str]) -> PipelineConfig:
    """The pipeline settings of ``pp_size > 1``; their problems are appended to ``errors``."""
    # lazy: measured import time (bench/startup_instructions.py): the parallelism dataclasses load only when asked for
    from overdrive.config import PipelineConfig

    given = parallelism_config.pp_handler if parallelism_config is not None else None
    try:
        config = PipelineConfig(**given) if isinstance(given, dict) else given or PipelineConfig()
    except TypeError as exc:
        errors.append(f"pp_handler={given!r}: {exc}; its fields are {field_names(PipelineConfig)}")
        return PipelineConfig()
    errors.extend(config.problems(pp_size))
    if fsdp_plugin is not None and fsdp_plugin.cpu_ram_efficient_loading:
        errors.append("cpu_ram_efficient_loading=True is not supported with pp_size > 1 yet: every process builds "
                      "the whole model before it is cut into stages; leave it False")
    return config


def launched_parallelism(launched: dict[str, Any], fsdp_plugin: FullyShardedDataParallelPlugin | None,
                          parallelism_config: ParallelismConfig | None
                          ) -> tuple[FullyShardedDataParallelPlugin | None, ParallelismConfig | None]:
    """The FSDP plugin and parallelism sizes a launch config (Accelerate's YAML keys) asks for, unless the
    script gave its own."""
    if fsdp_plugin is None and str(launched.get("distributed_type", "")).upper() == "FSDP":
        # lazy: measured import time (bench/startup_instructions.py): FSDP's plugin loads when FSDP is asked for
        from overdrive.config import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin.from_config_dict(launched.get("fsdp_config") or {})
    sizes = launched.get("parallelism_config") or {}
    if parallelism_config is None and sizes:
        # lazy: measured import time (bench/startup_instructions.py): the parallelism dataclasses load only when asked for
        from overdrive.config import ParallelismConfig

        parallelism_config = ParallelismConfig(**{k.removeprefix("parallelism_config_"): v for k, v in sizes.items()})
    return fsdp_plugin, parallelism_config


def strategy_settings(parallel: Parallelism, ddp: DistributedDataParallelKwargs | None) -> StrategySettings:
    """The chosen strategy's own settings (the pipeline's with its stage strategy's inside)."""
    if parallel.pipeline is None:
        return _stage_settings(parallel.strategy, parallel, ddp)
    # lazy: the schedule module and the pipeline's settings (their dataclasses) load for a pipeline only
    from overdrive.resolve.sharded_settings import PipelineStrategySettings
    from overdrive.transforms.pipeline.schedule import (
        default_stages_per_rank,
        schedule_name,
        stage_style,
        stage_to_rank,
    )

    config, pp = parallel.pipeline, parallel.dims.pp
    name = schedule_name(config.schedule) or config.schedule
    per_rank = config.stages_per_rank or default_stages_per_rank(name)
    stage_name = parallel.stage_strategy or "single"
    num_stages = pp * per_rank
    return PipelineStrategySettings(
        schedule=name, num_microbatches=config.num_microbatches or pp * per_rank, stages_per_rank=per_rank,
        stage_strategy=stage_name, stage_settings=_stage_settings(stage_name, parallel, ddp, pipeline_stage=True),
        split_points=tuple(config.split_points) if config.split_points else None, balance=config.balance,
        loss_fn=config.loss_fn,
        sync_module_states=parallel.fsdp.sync_module_states if parallel.fsdp is not None else True,
        output_pp_rank=stage_to_rank(pp, num_stages, stage_style(name))[num_stages - 1])


def _stage_settings(name: str, parallel: Parallelism, ddp: DistributedDataParallelKwargs | None,
                    pipeline_stage: bool = False) -> StageSettings:
    """The settings of ``name`` (``single``, ``ddp`` or ``fsdp2``), alone or wrapping a pipeline stage."""
    if name == "single":
        return SingleSettings()
    if name == "ddp":
        return DDPSettings(options=copy.copy(ddp) if ddp is not None else DistributedDataParallelKwargs())
    if name != "fsdp2":
        raise KeyError(name)
    # lazy: measured import time (bench/startup_instructions.py): FSDP2's settings load when it is chosen
    from overdrive.config import FullyShardedDataParallelPlugin
    from overdrive.resolve.sharded_settings import FSDP2Settings

    fsdp = copy.copy(parallel.fsdp) if parallel.fsdp is not None else FullyShardedDataParallelPlugin()
    if pipeline_stage:  # the stage strategy must not broadcast the stage itself: the pipeline does it, tied weights included
        fsdp = dataclasses.replace(fsdp, sync_module_states=False)
    return FSDP2Settings(fsdp=fsdp)
