"""Turn constructor arguments, the launch config and the environment into frozen plans.

This module (with ``runtime.cluster``, which it calls) is the only place that reads ``os.environ``.
Every problem with the arguments is reported at once, each naming the value given and the valid
choices.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from overdrive.config import (
    ActivationCheckpointingKwargs,
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
    TorchDynamoPlugin,
    TorchTensorParallelPlugin,
    field_names,
)
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, launch_config  # noqa: F401 - re-exported
from overdrive.precision import PrecisionPolicy, precision_policy
from overdrive.resolve.process import ProcessPlan, resolve_process  # noqa: F401 - re-exported
from overdrive.runtime.mesh import ParallelDims, check_sizes, fill_sizes
from overdrive.transforms.path import CompileSettings, ModelTransforms


# -- each strategy's own settings, typed: a misspelt setting is a TypeError, not silently dropped -----------
@dataclass(frozen=True)
class SingleSettings:
    """One process: nothing to set."""


@dataclass(frozen=True)
class DDPSettings:
    """``DistributedDataParallel``'s arguments and communication hook."""

    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)


@dataclass(frozen=True)
class FSDP2Settings:
    """Sharding (``fully_shard``) settings; precision, compile and checkpointing are the model path's."""

    fsdp: FullyShardedDataParallelPlugin = field(default_factory=FullyShardedDataParallelPlugin)


@dataclass(frozen=True)
class PipelineStrategySettings:
    """A resolved pipeline: its schedule, and the strategy (with its settings) that wraps each stage."""

    schedule: str
    num_microbatches: int
    stages_per_rank: int
    stage_strategy: str
    stage_settings: Any
    split_points: tuple[str, ...] | None = None
    balance: str = "layers"
    loss_fn: Callable[..., Any] | None = None
    #: make each stage equal over the processes holding it, from the first of them
    sync_module_states: bool = True
    #: the pipeline rank holding the last stage, whose outputs count when results are gathered
    output_pp_rank: int = 0


@dataclass(frozen=True)
class TrainingPlan:
    """Everything an ``Accelerator`` does differently from plain PyTorch, decided once.

    It holds copies of the user's configuration objects; what changes while training (the project's
    checkpoint iteration, the data loaders' ``even_batches``) is the Accelerator's runtime state."""

    strategy: str
    precision: PrecisionPolicy
    #: the accumulation settings (a copy, with ``num_steps`` resolved)
    accumulation: GradientAccumulationPlugin
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
    #: the strategy's own typed settings (``SingleSettings``, ``DDPSettings``, ``FSDP2Settings``,
    #: ``PipelineStrategySettings`` or DeepSpeed's ``DeepSpeedSettings``)
    strategy_settings: Any = field(default_factory=SingleSettings)
    #: the model path every strategy runs: tensor parallel, activation checkpointing, compile, precision
    transforms: ModelTransforms = field(default_factory=ModelTransforms)
    #: how the processes divide the work (plain DDP: dp_replicate = every process)
    dims: ParallelDims = field(default_factory=ParallelDims)
    #: whether the job asked for a device mesh (a parallelism config, FSDP or tensor parallel)
    uses_mesh: bool = False
    cp_comm_strategy: str = "allgather"
    #: with DeepSpeed: the plugins and the settings that fill their "auto" values (a ``DeepSpeedSettings``)
    deepspeed: Any = None
    #: with mixed_precision="fp8": the recipe (``AORecipeKwargs`` / ``TERecipeKwargs``, defaults filled in)
    fp8: AORecipeKwargs | TERecipeKwargs | None = None
    #: the FSDP plugin given (a copy), or None: what ``AcceleratorState.fsdp_plugin`` reports
    fsdp: FullyShardedDataParallelPlugin | None = None

    @property
    def dynamo_backend(self) -> str | None:
        """The ``torch.compile`` backend, or None without compilation."""
        return self.transforms.compile.backend if self.transforms.compile is not None else None

    @property
    def output_pp_rank(self) -> int:
        """The pipeline rank whose outputs count (the last one, or rank 0 for V-shaped schedules)."""
        settings = self.strategy_settings
        return settings.output_pp_rank if isinstance(settings, PipelineStrategySettings) else self.dims.pp - 1


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
    ActivationCheckpointingKwargs: "checkpointing",
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
                     log_with: Any, dynamo_backend: str | None, dynamo_plugin: TorchDynamoPlugin | None = None,
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
    accumulation = copy.copy(gradient_accumulation_plugin)
    accumulation.num_steps = steps if isinstance(steps, int) and steps >= 1 else 1

    valid_rng = {member.value for member in RNGType}
    rng = tuple(str(getattr(r, "value", r)) for r in (rng_types or ["generator"]))
    bad_rng = [r for r in rng if r not in valid_rng]
    if bad_rng:
        errors.append(f"rng_types={bad_rng!r} are not valid; choose from {sorted(valid_rng)}")

    compile_settings = _compile_settings(dynamo_plugin, dynamo_backend, launched, errors)

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
    transforms = _model_transforms(parallel, handlers.get("checkpointing"), compile_settings, precision, fp8)
    if log_with is None:
        log_with = ()
    elif not isinstance(log_with, (list, tuple)):
        log_with = (log_with,)
    return TrainingPlan(
        strategy="deepspeed" if deepspeed is not None else parallel.strategy,
        precision=precision,
        accumulation=accumulation,
        dataloader=copy.copy(dataloader_config or DataLoaderConfiguration()),
        device_placement=True if device_placement is None else device_placement,
        step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        rng_types=rng,
        # DeepSpeed scales an fp16 loss itself (its fp16 block)
        scaler=GradScalerKwargs(enabled=False) if deepspeed else handlers.get("scaler") or GradScalerKwargs(),
        autocast=handlers.get("autocast") or AutocastKwargs(),
        profile=handlers.get("profile"),
        project=copy.copy(project_config or ProjectConfiguration()),
        log_with=tuple(log_with),
        strategy_settings=deepspeed if deepspeed is not None else _strategy_settings(parallel, handlers.get("ddp")),
        transforms=transforms,
        dims=parallel.dims,
        uses_mesh=parallel.uses_mesh,
        cp_comm_strategy=parallel.cp_comm_strategy,
        deepspeed=deepspeed,
        fp8=fp8,
        fsdp=copy.copy(parallel.fsdp) if parallel.fsdp is not None else None,
    )


def _compile_settings(plugin: TorchDynamoPlugin | None, backend: str | None, launched: dict[str, Any],
                      errors: list[str]) -> CompileSettings | None:
    """``torch.compile``'s settings from ``dynamo_plugin`` and ``dynamo_backend`` (or the launch config's);
    None without compilation."""
    if plugin is not None and backend is not None and plugin.backend is not None \
            and plugin.backend_name != str(backend).lower():
        errors.append(f"dynamo_backend={backend!r} and TorchDynamoPlugin(backend={plugin.backend!r}) disagree; give the "
                      "backend in one place")
    if plugin is None:  # the launch config's (Accelerate's dynamo_config keys, or its variables)
        given = launched.get("dynamo_config") or {}
        plugin = TorchDynamoPlugin(
            mode=given.get("dynamo_mode"), fullgraph=bool(given.get("dynamo_use_fullgraph", False)),
            dynamic=given.get("dynamo_use_dynamic"),
            use_regional_compilation=bool(given.get("dynamo_use_regional_compilation", False)))
    else:
        plugin = copy.copy(plugin)
    if plugin.backend is None:
        plugin.backend = backend if backend is not None else launched.get("dynamo_backend")
    problems = plugin.problems()
    errors.extend(problems)
    if problems or plugin.backend_name == "no":
        return None
    return CompileSettings(backend=plugin.backend_name, mode=plugin.mode, fullgraph=plugin.fullgraph,
                           dynamic=plugin.dynamic, options=dict(plugin.options) if plugin.options else None,
                           disable=plugin.disable, regional=plugin.use_regional_compilation)


def _model_transforms(parallel: _Parallelism, checkpointing: ActivationCheckpointingKwargs | None,
                      compile_settings: CompileSettings | None, precision: PrecisionPolicy,
                      fp8: Any = None) -> ModelTransforms:
    """The model path's settings: the same meaning under every strategy."""
    fsdp = copy.copy(parallel.fsdp) if parallel.fsdp is not None else FullyShardedDataParallelPlugin()
    tp = parallel.tp or TorchTensorParallelPlugin()
    wanted = fsdp.activation_checkpointing or (checkpointing is not None and checkpointing.enabled)
    names = tuple(checkpointing.block_names or ()) if checkpointing is not None else ()
    return ModelTransforms(
        tp_plan=dict(tp.tp_plan) if tp.tp_plan else None, sequence_parallel=tp.sequence_parallel,
        activation_checkpointing=wanted, block_names=names, compile=compile_settings, fsdp=fsdp,
        precision=precision, fp8=fp8)


def _strategy_settings(parallel: _Parallelism, ddp: DistributedDataParallelKwargs | None) -> Any:
    """The chosen strategy's own settings (the pipeline's with its stage strategy's inside)."""
    ddp_settings = DDPSettings(options=copy.copy(ddp) if ddp is not None else DistributedDataParallelKwargs())
    fsdp = copy.copy(parallel.fsdp) if parallel.fsdp is not None else FullyShardedDataParallelPlugin()
    by_name = {"single": SingleSettings(), "ddp": ddp_settings, "fsdp2": FSDP2Settings(fsdp=fsdp)}
    if parallel.pipeline is None:
        return by_name[parallel.strategy]
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
    # the stage strategy must not broadcast the stage itself: the pipeline does it, tied weights included
    stage_settings = (FSDP2Settings(fsdp=dataclasses.replace(fsdp, sync_module_states=False)) if stage_name == "fsdp2"
                      else by_name[stage_name])
    num_stages = pp * per_rank
    return PipelineStrategySettings(
        schedule=name, num_microbatches=config.num_microbatches or pp * per_rank, stages_per_rank=per_rank,
        stage_strategy=stage_name, stage_settings=stage_settings,
        split_points=tuple(config.split_points) if config.split_points else None, balance=config.balance,
        loss_fn=config.loss_fn, sync_module_states=fsdp.sync_module_states if parallel.fsdp is not None else True,
        output_pp_rank=stage_to_rank(pp, num_stages, stage_style(name))[num_stages - 1])
