"""The ``Accelerator`` facade: Accelerate's verbs over a resolved plan, a strategy and a precision.

Every method is short and calls into the objects the plan chose; none asks which strategy is in use.
This module holds construction, ``prepare``, the training step, profiling and memory; the class inherits
the rest, one module per concern: ``processes`` (device, ranks, mesh axes, process control),
``collectives`` (gather, reduce, triggers), ``checkpoint`` (``save_state``,
``load_state``, ``save_model``, ...), ``tracking`` (``init_trackers``, ``log``, ``end_training``)
and ``surface`` (Accelerate's attribute names).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from overdrive.accelerator.checkpoint import CheckpointVerbs
from overdrive.accelerator.collectives import CollectiveVerbs, report_hang, reports_hangs
from overdrive.accelerator.processes import ProcessSurface
from overdrive.accelerator.profiling import build_profiler
from overdrive.accelerator.surface import AccelerateSurface
from overdrive.accelerator.tracking import TrackingVerbs
from overdrive.config import (  # GradientAccumulationPlugin: also a name of accelerate.accelerator
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    ProfileKwargs,
    ProjectConfiguration,
)
from overdrive.config.choices import unexpected_arguments
from overdrive.data import prepare_data_loader, skip_first_batches
from overdrive.helpers.memory import release_memory
from overdrive.helpers.unwrap import _compiled_inner, _recompiled, extract_model_from_parallel
from overdrive.precision.amp import AmpPrecision
from overdrive.resolve import TrainingPlan, resolve_training, split_kwargs_handlers
from overdrive.runtime.mesh import ParallelMesh
from overdrive.strategies import StrategyBase, create_strategy
from overdrive.strategies.base import StrategyContext
from overdrive.strategies.deepspeed import resolve_deepspeed
from overdrive.training.accumulation import NO_CONTEXT, AccumulationWindow
from overdrive.training.optimizer import AcceleratedOptimizer
from overdrive.training.prepared import PreparedObjects
from overdrive.training.scheduler import AcceleratedScheduler
from overdrive.training.state import AcceleratorState, GradientState
from overdrive.transforms.hooks import HookRegistry, remove_hooks

if TYPE_CHECKING:  # the plugin classes load when a plugin is given, not with the Accelerator
    from overdrive.config import (
        AutocastKwargs,
        FullyShardedDataParallelPlugin,
        MegatronLMPlugin,
        ParallelismConfig,
        RNGType,
        TorchDynamoPlugin,
        TorchTensorParallelPlugin,
    )
    from overdrive.strategies.deepspeed import DeepSpeedPlugin


def _refuse_quantized_placement(model: nn.Module, device: torch.device, distributed: bool) -> None:
    """Accelerate's checks of a model loaded in 8 or 4 bits (bitsandbytes) with a ``hf_device_map``: it must sit
    on the training device, on one device when the run is distributed, and not be offloaded to the CPU (unless
    bitsandbytes' multi-backend build runs it there) or to disk."""
    if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
        return
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return
    # read through the package (Accelerate's accelerate.accelerator), whose names Accelerate's tests patch
    package = sys.modules["overdrive.accelerator"]

    devices = set(device_map.values())
    multi_backend = package.is_bitsandbytes_multi_backend_available()
    if len(devices) > 1 and distributed:
        raise ValueError(f"this model was loaded in 8 or 4 bits across the devices {sorted(map(str, devices))}, "
                         "which cannot train in a distributed run; run one process (naive pipeline parallelism "
                         "over its devices), or load the model on one device")
    if len(devices) == 1:
        (where,) = devices
        index = torch.device(where).index if isinstance(where, (str, torch.device)) else int(where)
        elsewhere = torch.device(device.type, index) != device and (device.index is not None or index != 0)
        if elsewhere and not (device.type == "cpu" and multi_backend):
            raise ValueError(f"this model was loaded in 8 or 4 bits on {where!r}, not on the training device "
                             f"{device}; load it there, e.g. device_map={{'': torch.cuda.current_device()}}")
    if ("cpu" in devices and (not multi_backend or package.is_xpu_available())) or "disk" in devices:
        raise ValueError("a model loaded in 8 or 4 bits cannot train with CPU or disk offload (its device map "
                         f"holds {sorted(map(str, devices))}); load it on the training device, or install "
                         "bitsandbytes' multi-backend build to train it on the CPU")


def _mark_prepared(obj: Any) -> None:
    """``obj._is_accelerate_prepared = True``, which libraries read as Accelerate sets it (skipped where the
    object takes no attributes)."""
    try:
        obj._is_accelerate_prepared = True
    except (AttributeError, TypeError):
        pass


class Accelerator(ProcessSurface, CollectiveVerbs, CheckpointVerbs, TrackingVerbs, AccelerateSurface):
    """Run one training loop on a CPU, one device, or many processes, with mixed precision and
    gradient accumulation::

        accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = loss_fn(model(batch["x"]), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    """

    def __init__(self, device_placement: bool = True, split_batches: bool | None = None,
                 mixed_precision: str | None = None, gradient_accumulation_steps: int = 1, cpu: bool = False,
                 dataloader_config: DataLoaderConfiguration | None = None, deepspeed_plugin: Any = None,
                 fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
                 rng_types: list[str | RNGType] | None = None,
                 log_with: Any = None, project_dir: str | os.PathLike | None = None,
                 project_config: ProjectConfiguration | None = None,
                 gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 step_scheduler_with_optimizer: bool = True, kwargs_handlers: list[Any] | None = None,
                 dynamo_backend: str | None = None, dynamo_plugin: TorchDynamoPlugin | None = None,
                 parallelism_config: ParallelismConfig | None = None,
                 torch_tp_plugin: TorchTensorParallelPlugin | None = None,
                 deepspeed_plugins: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
                 megatron_lm_plugin: MegatronLMPlugin | None = None, **unsupported: Any) -> None:
        if unsupported:
            raise TypeError(unexpected_arguments("Accelerator()", type(self).__init__, unsupported))
        handlers = split_kwargs_handlers(kwargs_handlers)
        if split_batches:  # Accelerate 1.15 accepts the argument and ignores it: so does overdrive, and says so
            warnings.warn("Accelerator(split_batches=True) is ignored (as in Accelerate 1.15): pass "
                          "dataloader_config=DataLoaderConfiguration(split_batches=True)", stacklevel=2)
        if project_dir is not None:
            project_config = copy.copy(project_config or ProjectConfiguration())
            project_config.set_directories(str(project_dir))

        self.state = AcceleratorState(cpu=cpu, init_kwargs=handlers.get("init"))
        self.plan: TrainingPlan = resolve_training(
            self.state.plan, mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin, dataloader_config=dataloader_config,
            device_placement=device_placement, step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            rng_types=rng_types, handlers=handlers, project_config=project_config, log_with=log_with,
            dynamo_backend=dynamo_backend, dynamo_plugin=dynamo_plugin, fsdp_plugin=fsdp_plugin, parallelism_config=parallelism_config,
            tp_plugin=torch_tp_plugin, deepspeed_plugin=deepspeed_plugin,
            deepspeed_plugins=deepspeed_plugins,
            megatron_lm_plugin=megatron_lm_plugin, deepspeed_step=resolve_deepspeed)
        self.parallelism_config = parallelism_config
        self.state.adopt(self.plan)
        self.mesh = ParallelMesh(self.plan.dims, self.device.type, self.process_index, build=self.plan.uses_mesh,
                                 output_pp_rank=self.plan.output_pp_rank)
        # runtime state: what changes while training lives here, not in the frozen plan
        #: the project settings of this run; ``save_state`` advances its ``iteration``
        self.project_configuration: ProjectConfiguration = copy.copy(self.plan.project)
        #: the data-loader settings of this run (``even_batches`` may be changed)
        self.dataloader_config: DataLoaderConfiguration = copy.copy(self.plan.dataloader)
        #: the one owner of the accumulation window (position, size, loss divisor, sync, step counter)
        self.window = AccumulationWindow.from_plugin(self.plan.accumulation)
        self.gradient_state = GradientState(window=self.window)
        GradientState._make_current(self.window)
        self.precision = AmpPrecision(self.plan.precision, self.device, self.plan.autocast, self.plan.scaler)
        #: the hooks the model path puts on prepared models (autocast, engine casts)
        self.hooks = HookRegistry()
        #: parameters fp8 conversion replaced, id(old) -> (weakref(old), new): optimizers are pointed at the new
        self.fp8_replaced: dict[int, Any] = {}
        context = StrategyContext(device=self.device, mesh=self.mesh, precision=self.precision,
                                  transforms=self.plan.transforms, window=self.window,
                                  fp8_replaced=self.fp8_replaced, plugin_selection=self.state.deepspeed_selection)
        self.strategy: StrategyBase = create_strategy(self.plan.strategy, context, self.plan.strategy_settings)
        self.scaler = self.precision.scaler
        # backward() calls loss.backward() itself when neither a loss scale nor an engine takes part
        self._loss_backward = self.scaler is None and not self.strategy.owns_backward
        # the strategy's no_sync is the shared do-nothing context (one process, a pipeline, DeepSpeed):
        # accumulate() returns that context without calling it
        self._no_sync_does_nothing = self.strategy.no_sync_does_nothing
        #: what prepare() returned and register_for_checkpointing() added, in order
        self.prepared = PreparedObjects()
        self.strategy.track_prepared(self.prepared)
        self.flag_tensor: torch.Tensor | None = None

    # -- accumulation state (the window owns it) ----------------------------------------------------
    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-batch ends the accumulation window, so gradients are synchronised and the
        optimizer steps (set by ``accumulate``; Accelerate's name)."""
        return self.window.sync

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.window.sync = value

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (the accumulation window's length); settable, as in Accelerate."""
        return self.window.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.window.set_num_steps(value)

    @property
    def step(self) -> int:
        """Micro-batches begun by ``accumulate`` since the start (restored by ``load_state``)."""
        return self.window.step

    @step.setter
    def step(self, value: int) -> None:
        self.window.step = value

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because fp16 gradients overflowed."""
        return any(opt.step_was_skipped for opt in self.prepared.optimizers)

    # -- prepare ------------------------------------------------------------------------------------
    @reports_hangs
    def prepare(self, *args: Any, device_placement: list[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and LR schedulers, in any order and mix.

        Returns them in the order given (a single object when one was given); other objects pass
        through unchanged. Schedulers are prepared last so that they see the prepared optimizers.
        """
        # read first, as Accelerate's prepare does: after AcceleratorState._reset_state() this raises the
        # AttributeError that says so, before anything is prepared
        _ = self.state.distributed_type
        placement = device_placement or [None] * len(args)
        if len(placement) != len(args):
            raise ValueError(f"device_placement has {len(placement)} entries for {len(args)} objects")
        result = self.strategy.prepare_together(list(args))  # DeepSpeed: model + optimizer + scheduler -> engine
        for kinds in ((nn.Module,), (torch.optim.Optimizer, DataLoader), (torch.optim.lr_scheduler.LRScheduler,)):
            for i, obj in enumerate(list(result)):
                if isinstance(obj, kinds) and not self.prepared.contains(obj):
                    result[i] = self._prepare_one(obj, placement[i])
        for obj in result:
            if self.prepared.contains(obj):
                _mark_prepared(obj)
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        if isinstance(obj, nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=device_placement)
        if isinstance(obj, DataLoader):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        return self.prepare_scheduler(obj)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> nn.Module:
        """Run ``model`` through the model path, the same under every strategy: placement on the device,
        autocast for the mixed precision, fp8, tensor parallel, activation checkpointing, compile, then
        data parallel (DDP, or FSDP2's sharding). ``evaluation_mode`` leaves out the DDP wrapper, for
        inference (sharded parameters stay sharded)."""
        if getattr(model, "_is_accelerate_prepared", False):  # prepared already: never wrapped twice (Accelerate's rule)
            if not any(existing is model for existing in self.prepared.models):
                self.prepared.add_model(model)
            return model
        _refuse_quantized_placement(model, self.device, self.distributed_type != DistributedType.NO)
        place = self.plan.device_placement if device_placement is None else device_placement
        handles: list[Any] = []  # the hooks the model path adds, filed with the prepared model below
        try:
            prepared = self.strategy.wrap_model(model, place, evaluation_mode, hooks=handles)
        except BaseException:
            remove_hooks(handles)  # a failed prepare leaves no hook behind
            raise
        self.hooks.add(handles, prepared, self.strategy.unwrap_model(prepared))
        self.prepared.add_model(prepared)
        _mark_prepared(prepared)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          device_placement: bool | None = None) -> AcceleratedOptimizer:
        """Prepare one optimizer (what ``prepare`` does for it): pointed at the parameters the prepared
        models train, wrapped in an ``AcceleratedOptimizer`` that steps only at the end of a window.
        Preparing the same optimizer twice returns the first wrapper. ``device_placement`` is accepted
        for Accelerate's signature and unused."""
        for existing in self.prepared.optimizers:  # prepared before: the same wrapper, registered (and saved) once
            if existing is optimizer or existing.optimizer is optimizer:
                return existing
        models = self.prepared.models
        if self.plan.fp8 is not None:
            # lazy: only runs with an fp8 recipe load the fp8 module
            from overdrive.precision.fp8 import precompute_scales_after_step, repoint_optimizer

            repoint_optimizer(optimizer, self.fp8_replaced)  # weights torchao wrapped for fp8 all-gather
            optimizer = self.strategy.prepare_optimizer(optimizer, models)
            precompute_scales_after_step(optimizer, models)
        else:
            optimizer = self.strategy.prepare_optimizer(optimizer, models)
        prepared = optimizer if isinstance(optimizer, AcceleratedOptimizer) else AcceleratedOptimizer(
            optimizer, scaler=self.scaler, gradient_state=self.gradient_state)  # DeepSpeed's comes prepared
        self.prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Prepare one scheduler (what ``prepare`` does for it): an ``AcceleratedScheduler`` that steps with
        the prepared optimizers it belongs to (all of them if none is its own)."""
        optimizers = self.prepared.optimizers
        mine = [opt for opt in optimizers if opt.optimizer is scheduler.optimizer or opt is scheduler.optimizer]
        prepared = AcceleratedScheduler(
            scheduler, mine or optimizers, step_with_optimizer=self.plan.step_scheduler_with_optimizer,
            split_batches=self.split_batches, gradient_state=self.gradient_state,
            # stepped once per data shard, as Accelerate: each shard is one process's share of the batches
            num_processes=self.strategy.data_place(self.data_parallel_size, self.data_parallel_rank)[0])
        self.prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Callable | None = None) -> DataLoader:
        """Prepare one data loader (what ``prepare`` does for it): sharded over the data-parallel ranks (or
        dispatched from rank 0), batches moved to the device (unless ``device_placement=False``), as the
        ``dataloader_config`` says. ``slice_fn_for_dispatch`` cuts a dispatched batch (Accelerate's)."""
        config = self.dataloader_config
        num_shards, shard = self.strategy.data_place(self.data_parallel_size, self.data_parallel_rank)
        prepared = prepare_data_loader(
            data_loader, device=self.device, num_processes=num_shards,
            process_index=shard, torch_device_mesh=self.torch_device_mesh,
            split_batches=config.split_batches,
            put_on_device=self.plan.device_placement if device_placement is None else device_placement,
            rng_types=list(self.plan.rng_types), dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches, slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler, data_seed=config.data_seed,
            non_blocking=config.non_blocking, use_stateful_dataloader=config.use_stateful_dataloader,
            gradient_state=self.gradient_state, exact_resume=config.exact_resume)
        hook = self.strategy.loader_hook()
        if hook is not None:
            prepared.before_epoch = hook
        self.prepared.dataloaders.append(prepared)
        return prepared

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> nn.Module:
        """The user's module inside a prepared one. ``keep_fp32_wrapper=False`` removes every hook the model
        path put on it (autocast, casts), whatever the strategy; ``keep_torch_compile=False`` returns the
        module inside a ``torch.compile`` wrapper (compilation by ``prepare`` is in place: nothing to strip)."""
        compiled = _compiled_inner(model)  # torch.compile applied after prepare
        # then the DDP / DataParallel wrappers the user put on themselves, as Accelerate unwraps them
        inner = extract_model_from_parallel(self.strategy.unwrap_model(model if compiled is None else compiled),
                                            keep_fp32_wrapper=keep_fp32_wrapper)
        plain = getattr(inner, "_orig_mod", inner)
        if not keep_fp32_wrapper:
            self.hooks.remove(model, inner, plain)
        if not keep_torch_compile:
            return plain
        return inner if compiled is None else _recompiled(model, inner)  # a compiled wrapper of the user's module

    # -- the training step --------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided over the accumulation window and scaled for fp16. Under DeepSpeed the
        engine's backward, and its step at the end of each window (``optimizer.step()`` is then a no-op)."""
        window = self.window
        if window.divisor > 1 and "scale_wrt_gas" not in kwargs:  # with it, DeepSpeed's caller scales (Trainer)
            loss = loss / window.divisor
        try:  # DDP's and FSDP's gradient collectives run in here
            if self._loss_backward:  # what strategy and precision would do, without their two calls
                loss.backward(**kwargs)
            else:
                self.strategy.backward(loss, self.precision, window.sync, **kwargs)
        except Exception as error:
            report_hang(error)
            raise

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate gradients over ``gradient_accumulation_steps`` batches: gradients synchronise and
        the optimizer and scheduler step only on the last batch of each window (or of the data).

        Use as ``with accelerator.accumulate(model):`` around one batch's step."""
        prepared = self.prepared.model_ids
        for model in models:
            if id(model) not in prepared:
                raise ValueError(f"accumulate() got a model that prepare() did not return: "
                                 f"{type(model).__name__}; pass the object that accelerator.prepare() gave back")
        window = self.window
        progress = GradientState._progress
        if window.begin(progress.active_dataloader, progress.end_of_dataloader) or window.sync_each_batch:
            return NO_CONTEXT  # nothing to enter
        if self._no_sync_does_nothing:
            return NO_CONTEXT
        if len(models) == 1:
            return self.strategy.no_sync(models[0])
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.no_sync(model))
        return stack

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient synchronisation of ``model`` in this block's backward."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Synchronise ``model``'s gradients in this block's backward even inside ``no_sync``."""
        return self.strategy.sync_in_backward(model)

    def unscale_gradients(self, optimizer: AcceleratedOptimizer | list | None = None) -> None:
        """Divide fp16-scaled gradients by the loss scale (done once per step, before clipping)."""
        if self.scaler is None or not self.sync_gradients:
            return
        chosen = (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer] if optimizer
                  else self.prepared.optimizers)
        for opt in chosen:
            opt.unscale_()

    @reports_hangs
    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float = 2) -> torch.Tensor:
        """Clip gradients by their global norm (across processes) and return that norm."""
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(list(parameters), max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp each gradient of ``parameters`` to ``[-clip_value, clip_value]`` (unscaled first)."""
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
        """Mixed-precision autocast for code outside the prepared models' forward."""
        return self.precision.autocast(autocast_handler)

    # -- profiling and memory -----------------------------------------------------------------------
    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """``torch.profiler.profile`` with the handler's options; with ``output_trace_dir`` each process
        writes its Chrome trace there as ``trace_rank_<index>.json``."""
        handler = profile_handler or self.plan.profile or ProfileKwargs()
        with build_profiler(handler, self.device, self.process_index) as profiler:
            yield profiler

    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop the references this Accelerator holds (and ``objects``) and empty the device cache."""
        self.hooks.clear()
        self.prepared.clear()
        self.window.reset()
        return release_memory(*objects)

    clear = free_memory

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """``dataloader`` skipping the first ``num_batches`` batches of its next epoch (where ``load_state``
        would resume it)."""
        return skip_first_batches(dataloader, num_batches)

    def __repr__(self) -> str:
        return (f"Accelerator(strategy={self.plan.strategy!r}, device={self.device}, "
                f"num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps})")

