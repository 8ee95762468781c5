"""Turn constructor arguments, the launch config and the environment into frozen plans.

This module (with ``runtime.cluster``, which it calls) is the only place that reads ``os.environ``.
Every problem with the arguments is reported at once, each naming the value given and the valid
choices.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from overdrive.config import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ParallelismConfig,
    PipelineConfig,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    TERecipeKwargs,
    TorchTensorParallelPlugin,
    field_names,
)
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, launch_config  # noqa: F401 - re-exported
from overdrive.precision import PrecisionPolicy, precision_policy
from overdrive.resolve.process import ProcessPlan, resolve_process  # noqa: F401 - re-exported
from overdrive.runtime.mesh import ParallelDims, check_sizes, fill_sizes


@dataclass(frozen=True)
class AccumulationPlan:
    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclass(frozen=True)
class TrainingPlan:
    """Everything an ``Accelerator`` does differently from plain PyTorch, decided once."""

    strategy: str
    precision: PrecisionPolicy
    accumulation: AccumulationPlan
    dataloader: DataLoaderConfiguration
    device_placement: bool = True
    step_scheduler_with_optimizer: bool = True
    rng_types: tuple[str, ...] = ()
    ddp: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    scaler: GradScalerKwargs = field(default_factory=GradScalerKwargs)
    autocast: AutocastKwargs = field(default_factory=AutocastKwargs)
    profile: ProfileKwargs | None = None
    project: ProjectConfiguration = field(default_factory=ProjectConfiguration)
    log_with: tuple[Any, ...] = ()
    dynamo_backend: str | None = None
    #: how the processes divide the work (plain DDP: dp_replicate = every process)
    dims: ParallelDims = field(default_factory=ParallelDims)
    #: whether the job asked for a device mesh (a parallelism config, FSDP or tensor parallel)
    uses_mesh: bool = False
    fsdp: FullyShardedDataParallelPlugin | None = None
    tp: TorchTensorParallelPlugin | None = None
    cp_comm_strategy: str = "allgather"
    #: with pp_size > 1: the pipeline settings, and the strategy that wraps each stage ("single", "ddp", "fsdp2")
    pipeline: PipelineConfig | None = None
    stage_strategy: str | None = None
    #: with DeepSpeed: the plugins and the settings that fill their "auto" values (a ``DeepSpeedSettings``)
    deepspeed: Any = None
    #: with mixed_precision="fp8": the recipe (``AORecipeKwargs`` / ``TERecipeKwargs``, defaults filled in)
    fp8: AORecipeKwargs | TERecipeKwargs | None = None


@dataclass(frozen=True)
class _Parallelism:
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
                        errors: list[str]) -> _Parallelism:
    """The strategy and mesh sizes for the plugins given; problems are appended to ``errors``."""
    from overdrive.transforms.context_parallel import comm_strategy_of, context_parallel_problem

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
    cp_comm = comm_strategy_of(parallelism_config.cp_handler if parallelism_config else None)
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
        return _Parallelism("pipeline", dims, uses_mesh, fsdp_plugin, tp_plugin, cp_comm, pipeline, strategy)
    return _Parallelism(strategy, dims, uses_mesh, fsdp_plugin, tp_plugin, cp_comm)


def _pipeline_config(parallelism_config: ParallelismConfig | None, fsdp_plugin: FullyShardedDataParallelPlugin | None,
                     pp_size: int, errors: list[str]) -> PipelineConfig:
    """The pipeline settings of ``pp_size > 1``; their problems are appended to ``errors``."""
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


_HANDLER_SLOTS = {
    DistributedDataParallelKwargs: "ddp",
    GradScalerKwargs: "scaler",
    AutocastKwargs: "autocast",
    ProfileKwargs: "profile",
    InitProcessGroupKwargs: "init",
    AORecipeKwargs: "fp8",
    TERecipeKwargs: "fp8",
}


def split_kwargs_handlers(handlers: list[Any] | None) -> dict[str, Any]:
    """Sort kwargs handlers by kind; a kind given twice or an unknown object is an error."""
    found: dict[str, Any] = {}
    for handler in handlers or []:
        slot = _HANDLER_SLOTS.get(type(handler))
        if slot is None:
            valid = ", ".join(cls.__name__ for cls in _HANDLER_SLOTS)
            raise ValueError(f"kwargs_handlers got {handler!r}, which is not one of: {valid}")
        if slot == "fp8" and slot in found:
            raise ValueError(f"kwargs_handlers has two fp8 recipes ({type(found[slot]).__name__} and "
                             f"{type(handler).__name__}); give one")
        if slot in found:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__} objects; give one")
        found[slot] = handler
    return found


def _launched_parallelism(launched: dict[str, Any], fsdp_plugin: FullyShardedDataParallelPlugin | None,
                          parallelism_config: ParallelismConfig | None
                          ) -> tuple[FullyShardedDataParallelPlugin | None, ParallelismConfig | None]:
    """The FSDP plugin and parallelism sizes a launch config (Accelerate's YAML keys) asks for, unless the
    script gave its own."""
    if fsdp_plugin is None and str(launched.get("distributed_type", "")).upper() == "FSDP":
        fsdp_plugin = FullyShardedDataParallelPlugin.from_config_dict(launched.get("fsdp_config") or {})
    sizes = launched.get("parallelism_config") or {}
    if parallelism_config is None and sizes:
        parallelism_config = ParallelismConfig(**{k.removeprefix("parallelism_config_"): v for k, v in sizes.items()})
    return fsdp_plugin, parallelism_config


def _deepspeed(launched: dict[str, Any], plugin: Any, plugins: Any, mixed_precision: str | None, steps: int,
               accumulation_plugin: GradientAccumulationPlugin | None, dataloader: DataLoaderConfiguration | None,
               others: dict[str, Any], errors: list[str], local_rank: int = 0) -> Any:
    """The DeepSpeed settings (None without DeepSpeed); the Accelerator's accumulation counts as given when
    it is not 1."""
    if plugin is None and plugins is None and str(launched.get("distributed_type", "")).upper() != "DEEPSPEED":
        return None
    from overdrive.resolve.deepspeed import resolve_deepspeed

    if accumulation_plugin is not None and accumulation_plugin.num_steps is not None:
        steps = accumulation_plugin.num_steps
    elif steps == 1:
        steps = launched.get("gradient_accumulation_steps", 1)
    return resolve_deepspeed(plugin, plugins, launched, mixed_precision=mixed_precision,
                             explicit_steps=None if steps == 1 else steps,
                             split_batches=bool(dataloader and dataloader.split_batches), others=others, errors=errors,
                             local_rank=local_rank)


def resolve_training(process: ProcessPlan, *, mixed_precision: str | None, gradient_accumulation_steps: int,
                     gradient_accumulation_plugin: GradientAccumulationPlugin | None,
                     dataloader_config: DataLoaderConfiguration | None, device_placement: bool | None,
                     step_scheduler_with_optimizer: bool, rng_types: list[str | RNGType] | None,
                     handlers: dict[str, Any], project_config: ProjectConfiguration | None,
                     log_with: Any, dynamo_backend: str | None,
                     fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
                     parallelism_config: ParallelismConfig | None = None,
                     tp_plugin: TorchTensorParallelPlugin | None = None, deepspeed_plugin: Any = None,
                     deepspeed_plugins: Any = None, megatron_lm_plugin: Any = None) -> TrainingPlan:
    """The frozen ``TrainingPlan`` for the Accelerator's arguments, the launch config and the
    environment; every problem is reported at once in one ``ValueError``."""
    launched = launch_config()
    errors: list[str] = []
    fsdp_label = "fsdp_plugin" if fsdp_plugin is not None else "the launch config's FSDP (distributed_type: FSDP)"
    fsdp_plugin, parallelism_config = _launched_parallelism(launched, fsdp_plugin, parallelism_config)
    parallel = resolve_parallelism(process, fsdp_plugin, parallelism_config, tp_plugin, errors)

    if mixed_precision is None:
        mixed_precision = launched.get("mixed_precision", "no")
    deepspeed = _deepspeed(launched, deepspeed_plugin, deepspeed_plugins, mixed_precision, gradient_accumulation_steps,
                           gradient_accumulation_plugin, dataloader_config, {
                               fsdp_label: fsdp_plugin, "parallelism_config": parallelism_config,
                               "torch_tp_plugin": tp_plugin}, errors, process.info.local_rank)
    if deepspeed is not None:
        mixed_precision = deepspeed.mixed_precision  # the DeepSpeed config may turn it on
    if megatron_lm_plugin is not None:
        from overdrive.resolve.megatron import check_plugin

        check_plugin(megatron_lm_plugin, process.info.world_size, errors)
    precision = None
    try:
        precision = precision_policy(mixed_precision, process.device)
    except ValueError as exc:
        errors.append(str(exc))
    fp8 = None
    if precision is not None and (precision.name == "fp8" or handlers.get("fp8") is not None):
        from overdrive.precision.fp8 import resolve_fp8  # only then: a one-process start imports no more

        fp8 = resolve_fp8(handlers.get("fp8"), launched.get("fp8_config"), precision.name, process.device,
                          "deepspeed" if deepspeed is not None else parallel.strategy,
                          parallel.dims.shards_parameters, errors,
                          efficient_loading=bool(parallel.fsdp and parallel.fsdp.cpu_ram_efficient_loading))
    if parallel.pipeline is not None and precision is not None and precision.loss_scaling:
        errors.append(f"mixed_precision={mixed_precision!r} scales the loss, which pipeline parallelism does not "
                      "support yet (an overflow must be agreed by every stage); use 'bf16' or 'no'")

    if gradient_accumulation_plugin is not None and gradient_accumulation_steps != 1:
        errors.append(
            f"gradient_accumulation_steps={gradient_accumulation_steps!r} was given together with "
            "gradient_accumulation_plugin; give the number of steps in one place only "
            "(GradientAccumulationPlugin(num_steps=...))"
        )
    if gradient_accumulation_plugin is None:
        steps = gradient_accumulation_steps
        if steps == 1 and "gradient_accumulation_steps" in launched:
            steps = launched["gradient_accumulation_steps"]
        gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
    steps = gradient_accumulation_plugin.num_steps
    steps = 1 if steps is None else steps
    if deepspeed is not None:
        steps = deepspeed.accumulation_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        errors.append(f"gradient_accumulation_steps={steps!r} is not valid; it must be an integer >= 1")
    accumulation = AccumulationPlan(
        num_steps=steps if isinstance(steps, int) and steps >= 1 else 1,
        adjust_scheduler=gradient_accumulation_plugin.adjust_scheduler,
        sync_with_dataloader=gradient_accumulation_plugin.sync_with_dataloader,
        sync_each_batch=gradient_accumulation_plugin.sync_each_batch,
    )

    valid_rng = {member.value for member in RNGType}
    rng = tuple(str(getattr(r, "value", r)) for r in (rng_types or ["generator"]))
    bad_rng = [r for r in rng if r not in valid_rng]
    if bad_rng:
        errors.append(f"rng_types={bad_rng!r} are not valid; choose from {sorted(valid_rng)}")

    if dynamo_backend is None:
        dynamo_backend = launched.get("dynamo_backend")
    if isinstance(dynamo_backend, str) and dynamo_backend.lower() == "no":
        dynamo_backend = None

    if log_with:
        from overdrive.tracking import check_log_with  # light: tracker libraries load only when started

        errors.extend(check_log_with(log_with if isinstance(log_with, (list, tuple)) else [log_with]))

    if dataloader_config is not None and dataloader_config.use_stateful_dataloader:
        from overdrive.compat.imports import is_torchdata_stateful_dataloader_available

        if not is_torchdata_stateful_dataloader_available():
            errors.append("DataLoaderConfiguration(use_stateful_dataloader=True) needs torchdata's StatefulDataLoader: "
                          "pip install 'torchdata>=0.8'; or leave it off: overdrive's prepared loaders save and "
                          "restore their position themselves (loader.state_dict(), accelerator.save_state)")
    if errors:
        raise ValueError("invalid Accelerator settings:\n  - " + "\n  - ".join(errors))
    assert precision is not None
    if log_with is None:
        log_with = ()
    elif not isinstance(log_with, (list, tuple)):
        log_with = (log_with,)
    return TrainingPlan(
        strategy="deepspeed" if deepspeed is not None else parallel.strategy,
        precision=precision,
        accumulation=accumulation,
        dataloader=dataloader_config or DataLoaderConfiguration(),
        device_placement=True if device_placement is None else device_placement,
        step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        rng_types=rng,
        ddp=handlers.get("ddp") or DistributedDataParallelKwargs(),
        # DeepSpeed scales an fp16 loss itself (its fp16 block)
        scaler=GradScalerKwargs(enabled=False) if deepspeed else handlers.get("scaler") or GradScalerKwargs(),
        autocast=handlers.get("autocast") or AutocastKwargs(),
        profile=handlers.get("profile"),
        project=project_config or ProjectConfiguration(),
        log_with=tuple(log_with),
        dynamo_backend=dynamo_backend,
        dims=parallel.dims,
        uses_mesh=parallel.uses_mesh,
        fsdp=parallel.fsdp,
        tp=parallel.tp,
        cp_comm_strategy=parallel.cp_comm_strategy,
        pipeline=parallel.pipeline,
        stage_strategy=parallel.stage_strategy,
        deepspeed=deepspeed,
        fp8=fp8,
    )
