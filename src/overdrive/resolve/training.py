"""The training step of the resolver: the Accelerator's arguments, the launch config and the environment
-> one frozen ``TrainingPlan``.

``resolve_training`` runs one small ``_resolve_*`` / ``_check_*`` step per setting (parallelism in
``parallelism.py``; DeepSpeed's own configuration in the DeepSpeed strategy, whose step the Accelerator hands
in: the strategies sit above the resolver); each appends its problems to one list, so every problem
is reported at once, each naming the value given and the valid choices. Nothing is built before all steps
ran: the strategy is created from the finished plan.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Protocol

from overdrive.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProjectConfiguration,
    RNGType,
    TorchDynamoPlugin,
)
from overdrive.config.choices import invalid_choice
from overdrive.helpers.imports import is_torchdata_stateful_dataloader_available
from overdrive.launchers.protocol import launch_config
from overdrive.precision import PrecisionPolicy, precision_policy
from overdrive.resolve.megatron import check_plugin
from overdrive.resolve.parallelism import (
    Parallelism,
    launched_parallelism,
    resolve_parallelism,
    strategy_settings,
)
from overdrive.resolve.plan import TrainingPlan
from overdrive.resolve.process import ProcessPlan
from overdrive.transforms.settings import CompileSettings, ModelTransforms

if TYPE_CHECKING:
    from overdrive.config import (
        ActivationCheckpointingKwargs,
        AORecipeKwargs,
        FullyShardedDataParallelPlugin,
        ParallelismConfig,
        TERecipeKwargs,
        TorchTensorParallelPlugin,
    )
    from overdrive.resolve.fault_tolerance import FaultTolerantSettings
    from overdrive.strategies.deepspeed import DeepSpeedSettings


class DeepSpeedStep(Protocol):
    """The DeepSpeed strategy's step of the plan (its ``resolve_deepspeed``): the run's DeepSpeed settings,
    each plugin checked against the Accelerator's arguments, every problem appended to ``errors``. The
    strategy owns its configuration and sits above the resolver, so whoever makes the plan hands the step in;
    the resolver decides whether DeepSpeed runs and calls it only then."""

    def __call__(self, plugin: Any, plugins: Any, launched: dict[str, Any], *, mixed_precision: str | None,
                 explicit_steps: int | None, split_batches: bool, others: dict[str, Any], errors: list[str],
                 local_rank: int = 0) -> DeepSpeedSettings | None: ...


def resolve_training(process: ProcessPlan, *, mixed_precision: str | None, gradient_accumulation_steps: int,
                     gradient_accumulation_plugin: GradientAccumulationPlugin | None,
                     dataloader_config: DataLoaderConfiguration | None, device_placement: bool | None,
                     step_scheduler_with_optimizer: bool, rng_types: list[str | RNGType] | None,
                     handlers: dict[str, Any], project_config: ProjectConfiguration | None,
                     log_with: Any, dynamo_backend: str | None, dynamo_plugin: TorchDynamoPlugin | None = None,
                     fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
                     parallelism_config: ParallelismConfig | None = None,
                     tp_plugin: TorchTensorParallelPlugin | None = None, deepspeed_plugin: Any = None,
                     deepspeed_plugins: Any = None, megatron_lm_plugin: Any = None,
                     deepspeed_step: DeepSpeedStep | None = None) -> TrainingPlan:
    """The frozen ``TrainingPlan`` for the Accelerator's arguments, the launch config and the
    environment; every problem is reported at once in one ``ValueError``. Each step below resolves one
    setting and appends its problems to ``errors``; nothing is built before all of them ran.
    ``deepspeed_step`` is the DeepSpeed strategy's step, needed when the run uses DeepSpeed."""
    launched = launch_config()
    errors: list[str] = []
    fsdp_label = "fsdp_plugin" if fsdp_plugin is not None else "the launch config's FSDP (distributed_type: FSDP)"
    fsdp_plugin, parallelism_config = launched_parallelism(launched, fsdp_plugin, parallelism_config)
    parallel = resolve_parallelism(process, fsdp_plugin, parallelism_config, tp_plugin, errors)
    if mixed_precision is None:
        mixed_precision = launched.get("mixed_precision", "no")
    deepspeed = _resolve_deepspeed(deepspeed_step, launched, deepspeed_plugin, deepspeed_plugins, mixed_precision,
                                   gradient_accumulation_steps, gradient_accumulation_plugin, dataloader_config, {
                                       fsdp_label: fsdp_plugin, "parallelism_config": parallelism_config,
                                       "torch_tp_plugin": tp_plugin}, errors, process.info.local_rank)
    if deepspeed is not None:
        mixed_precision = deepspeed.mixed_precision  # the DeepSpeed config may turn it on
    _check_megatron(megatron_lm_plugin, process, errors)
    precision = _resolve_precision(mixed_precision, process, parallel, errors)
    fp8 = _resolve_fp8(precision, handlers, launched, process, parallel, deepspeed is not None, errors)
    accumulation = _resolve_accumulation(gradient_accumulation_steps, gradient_accumulation_plugin, launched,
                                         deepspeed, errors)
    rng = _resolve_rng_types(rng_types, errors)
    compile_settings = _resolve_compile(dynamo_plugin, dynamo_backend, launched, errors)
    trackers = _resolve_log_with(log_with, (project_config or ProjectConfiguration()).logging_dir, errors)
    _check_dataloader(dataloader_config, errors)
    fault_tolerant = _resolve_fault_tolerance(launched, process, parallel, deepspeed is not None, handlers, errors)
    if errors:
        raise ValueError("invalid Accelerator settings:\n  - " + "\n  - ".join(errors))
    assert precision is not None
    strategy, settings = ("deepspeed", deepspeed) if deepspeed is not None else (
        ("ft_ddp" if fault_tolerant.fsdp is None else "ft_fsdp2", fault_tolerant) if fault_tolerant is not None
        else (parallel.strategy, strategy_settings(parallel, handlers.get("ddp"))))
    return TrainingPlan(
        strategy=strategy,
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
        init_kwargs=handlers.get("init"),
        project=copy.copy(project_config or ProjectConfiguration()),
        log_with=trackers,
        strategy_settings=settings,
        transforms=_model_transforms(parallel, handlers.get("checkpointing"), compile_settings, precision, fp8),
        dims=parallel.dims,
        uses_mesh=parallel.uses_mesh,
        cp_comm_strategy=parallel.cp_comm_strategy,
        deepspeed=deepspeed,
        fp8=fp8,
        fsdp=copy.copy(parallel.fsdp) if parallel.fsdp is not None else None,
    )


def _resolve_deepspeed(step: DeepSpeedStep | None, launched: dict[str, Any], plugin: Any, plugins: Any,
                       mixed_precision: str | None, steps: int, accumulation_plugin: GradientAccumulationPlugin | None,
                       dataloader: DataLoaderConfiguration | None, others: dict[str, Any], errors: list[str],
                       local_rank: int = 0) -> DeepSpeedSettings | None:
    """The DeepSpeed settings (None without DeepSpeed), from the DeepSpeed strategy's ``step``; the
    Accelerator's accumulation counts as given when it is not 1."""
    if plugin is None and plugins is None and str(launched.get("distributed_type", "")).upper() != "DEEPSPEED":
        return None
    if step is None:
        errors.append("DeepSpeed was asked for, but resolve_training was not given the DeepSpeed strategy's step "
                      "(the DeepSpeed strategy's resolve_deepspeed)")
        return None
    if accumulation_plugin is not None and accumulation_plugin.num_steps is not None:
        steps = accumulation_plugin.num_steps
    elif steps == 1:
        steps = launched.get("gradient_accumulation_steps", 1)
    return step(plugin, plugins, launched, mixed_precision=mixed_precision, explicit_steps=None if steps == 1 else steps,
                split_batches=bool(dataloader and dataloader.split_batches), others=others, errors=errors,
                local_rank=local_rank)


def _resolve_fault_tolerance(launched: dict[str, Any], process: ProcessPlan, parallel: Parallelism, deepspeed: bool,
                             handlers: dict[str, Any], errors: list[str]) -> FaultTolerantSettings | None:
    """torchft's replica groups when the launch config names a lighthouse (``--ft_lighthouse``), else None."""
    if not launched.get("ft_lighthouse"):
        return None
    # lazy: it loads the launch-settings validators (launchers/setting_kinds), which a start without a lighthouse
    # does not need (docs/benchmarks.md, "What cut the first step")
    from overdrive.resolve.fault_tolerance import resolve_fault_tolerance

    strategy = "deepspeed" if deepspeed else parallel.strategy if parallel.pipeline is None else "pipeline"
    return resolve_fault_tolerance(launched, process, strategy, handlers.get("ddp"), errors, fsdp=parallel.fsdp,
                                   dims=parallel.dims)


def _check_megatron(plugin: Any, process: ProcessPlan, errors: list[str]) -> None:
    """The Megatron-LM plugin's sizes against the world size (nothing without the plugin)."""
    if plugin is not None:
        check_plugin(plugin, process.info.world_size, errors)


def _resolve_precision(mixed_precision: str | None, process: ProcessPlan, parallel: Parallelism,
                       errors: list[str]) -> PrecisionPolicy | None:
    """The precision policy for ``mixed_precision`` on this device (None when it is invalid)."""
    try:
        precision = precision_policy(mixed_precision, process.device)
    except ValueError as exc:
        errors.append(str(exc))
        return None
    if parallel.pipeline is not None and precision.loss_scaling:
        errors.append(f"mixed_precision={mixed_precision!r} scales the loss, which pipeline parallelism does not "
                      "support yet (an overflow must be agreed by every stage); use 'bf16' or 'no'")
    return precision


def _resolve_fp8(precision: PrecisionPolicy | None, handlers: dict[str, Any], launched: dict[str, Any],
                 process: ProcessPlan, parallel: Parallelism, deepspeed: bool,
                 errors: list[str]) -> AORecipeKwargs | TERecipeKwargs | None:
    """The fp8 recipe (defaults filled in) with mixed_precision="fp8" or an fp8 kwargs handler, else None."""
    if precision is None or (precision.name != "fp8" and handlers.get("fp8") is None):
        return None
    from overdrive.precision.fp8 import resolve_fp8  # lazy: fp8's module (and its config) for fp8 runs only

    return resolve_fp8(handlers.get("fp8"), launched.get("fp8_config"), precision.name, process.device,
                       "deepspeed" if deepspeed else parallel.strategy, parallel.dims.shards_parameters, errors,
                       efficient_loading=bool(parallel.fsdp and parallel.fsdp.cpu_ram_efficient_loading))


def _resolve_accumulation(steps_given: int, plugin: GradientAccumulationPlugin | None, launched: dict[str, Any],
                          deepspeed: DeepSpeedSettings | None, errors: list[str]) -> GradientAccumulationPlugin:
    """The accumulation settings (a copy of the plugin given, or a new one) with ``num_steps`` resolved: the
    argument, else the launch config's, else DeepSpeed's config when it runs."""
    if plugin is not None and steps_given != 1:
        errors.append(f"gradient_accumulation_steps={steps_given!r} was given together with "
                      "gradient_accumulation_plugin; give the number of steps in one place only "
                      "(GradientAccumulationPlugin(num_steps=...))")
    if plugin is None:
        steps = steps_given
        if steps == 1 and "gradient_accumulation_steps" in launched:
            steps = launched["gradient_accumulation_steps"]
        plugin = GradientAccumulationPlugin(num_steps=steps)
    steps = 1 if plugin.num_steps is None else plugin.num_steps
    if deepspeed is not None:
        steps = deepspeed.accumulation_steps
    valid = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
    if not valid:
        errors.append(f"gradient_accumulation_steps={steps!r} is not valid; it must be an integer >= 1")
    accumulation = copy.copy(plugin)
    accumulation.num_steps = steps if valid else 1
    return accumulation


def _resolve_rng_types(rng_types: list[str | RNGType] | None, errors: list[str]) -> tuple[str, ...]:
    """The RNG names synchronised each epoch (``("generator",)`` by default)."""
    valid_rng = {member.value for member in RNGType}
    rng = tuple(str(getattr(r, "value", r)) for r in (rng_types or ["generator"]))
    bad_rng = [r for r in rng if r not in valid_rng]
    if bad_rng:
        errors.append(invalid_choice(f"rng_types={bad_rng!r}", bad_rng[0], sorted(valid_rng)))
    return rng


def _resolve_log_with(log_with: Any, logging_dir: str | None, errors: list[str]) -> tuple[Any, ...]:
    """The trackers named (a tuple), each checked, and a logging directory for those that write to one (as
    Accelerate checks in its constructor); the tracker libraries load only when started."""
    if log_with is None:
        return ()
    named = tuple(log_with) if isinstance(log_with, (list, tuple)) else (log_with,)
    if log_with:
        from overdrive.tracking.base import (  # lazy: trackers only
            check_log_with,
            trackers_needing_a_directory,
        )

        problems = check_log_with(list(named))
        errors.extend(problems)
        if not problems and logging_dir is None:
            errors.extend(f"Logging with `{name}` requires a `logging_dir` to be passed in: give "
                          "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)"
                          for name in trackers_needing_a_directory(list(named)))
    return named


def _check_dataloader(config: DataLoaderConfiguration | None, errors: list[str]) -> None:
    """A data-loader setting that needs a package which is not installed, or two that exclude each other."""
    if config is None or not config.use_stateful_dataloader:
        return
    if config.exact_resume:
        errors.append(_BOTH_RESUMES)
    if not is_torchdata_stateful_dataloader_available():
        errors.append("DataLoaderConfiguration(use_stateful_dataloader=True) needs torchdata's StatefulDataLoader: "
                      "pip install 'torchdata>=0.8'; or leave it off: overdrive's prepared loaders save and "
                      "restore their position themselves (DataLoaderConfiguration(exact_resume=True))")


_BOTH_RESUMES = ("DataLoaderConfiguration(exact_resume=True, use_stateful_dataloader=True): choose one way to resume "
                 "loaders: exact_resume (overdrive's own positions, exact at any number of processes) or "
                 "use_stateful_dataloader (torchdata's state dicts, as Accelerate)")


def _resolve_compile(plugin: TorchDynamoPlugin | None, backend: str | None, launched: dict[str, Any],
                      errors: list[str]) -> CompileSettings | None:
    """``torch.compile``'s settings from ``dynamo_plugin`` and ``dynamo_backend`` (or the launch config's);
    None without compilation."""
    if plugin is not None and backend is not None and plugin.backend is not None \
            and plugin.backend_name != str(backend).lower():
        errors.append(f"dynamo_backend={backend!r} and TorchDynamoPlugin(backend={plugin.backend!r}) disagree; give the "
                      "backend in one place")
    if plugin is None:  # the launch config's (Accelerate's dynamo_config keys, or its variables)
        given = launched.get("dynamo_config") or {}
        plugin = TorchDynamoPlugin(  # the backend given here wins over ACCELERATE_DYNAMO_BACKEND
            backend=backend if backend is not None else launched.get("dynamo_backend"), mode=given.get("dynamo_mode"), fullgraph=bool(given.get("dynamo_use_fullgraph", False)),
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


def _model_transforms(parallel: Parallelism, checkpointing: ActivationCheckpointingKwargs | None,
                      compile_settings: CompileSettings | None, precision: PrecisionPolicy,
                      fp8: Any = None) -> ModelTransforms:
    """The model path's settings: the same meaning under every strategy."""
    fsdp = copy.copy(parallel.fsdp) if parallel.fsdp is not None else None
    tp = parallel.tp
    wanted = (fsdp is not None and fsdp.activation_checkpointing) or (checkpointing is not None and checkpointing.enabled)
    names = tuple(checkpointing.block_names or ()) if checkpointing is not None else ()
    return ModelTransforms(
        tp_plan=dict(tp.tp_plan) if tp is not None and tp.tp_plan else None,
        sequence_parallel=tp is not None and tp.sequence_parallel,
        activation_checkpointing=wanted, block_names=names, compile=compile_settings, fsdp=fsdp,
        precision=precision, fp8=fp8)

