"""DeepSpeed ZeRO (stages 0-3, CPU / NVMe offload, bf16 / fp16) as a strategy.

DeepSpeed builds the model, its optimizer and its scheduler into one engine, so ``prepare()`` hands them
over together (``prepare_together``) and gets back the engine, an optimizer and a scheduler whose
``step()`` do nothing: ``accelerator.backward(loss)`` runs ``engine.backward(loss)`` and, on the last
micro-batch of an accumulation window, ``engine.step()``, which clips (``gradient_clipping``), steps the
optimizer and the scheduler and zeroes the gradients. The accumulation window is the Accelerator's: the
loss is divided by its length once (by the Accelerator; DeepSpeed's own division is turned off) and the
engine is told where each window ends.

The engine runs in the config's precision (bf16 / fp16 weights, fp32 master weights in the optimizer).
Floating inputs of the model are cast to that dtype and its floating outputs come back in fp32, so a loop
written for DDP runs unchanged.

Several models: each ``prepare()`` call builds one engine with the plugin selected at that moment
(``accelerator.state.select_deepspeed_plugin(name)``). ``accelerator.backward`` drives the engine
prepared last with an optimizer; to train several engines at once call each engine's own
``backward`` / ``step``.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from overdrive.config import DistributedType
from overdrive.helpers.ops import convert_to_fp32, recursively_apply
from overdrive.runtime import backend_for
from overdrive.runtime.group import world_size
from overdrive.strategies.base import StrategyBase, StrategyContext
from overdrive.strategies.deepspeed.checkpoint import EngineCheckpoint, is_engine
from overdrive.strategies.deepspeed.config import import_deepspeed
from overdrive.strategies.deepspeed.objects import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)
from overdrive.strategies.deepspeed.settle import DeepSpeedSettings, engine_config
from overdrive.training.optimizer import AcceleratedOptimizer

if TYPE_CHECKING:
    from overdrive.precision.amp import AmpPrecision


class DeepSpeedStrategy(StrategyBase):
    """DeepSpeed ZeRO: the model, optimizer and scheduler become one engine that steps at the end of each
    accumulation window (see the module). ``no_sync`` and ``sync_in_backward`` do nothing (the defaults):
    the engine reduces only where the window ends, as :meth:`backward` tells it."""

    owns_backward = True  # the engine's backward, which also steps at the end of a window
    name = "deepspeed"
    settings_type = DeepSpeedSettings

    def __init__(self, context: StrategyContext, settings: DeepSpeedSettings) -> None:
        super().__init__(context, settings)
        self.settings: DeepSpeedSettings = settings
        self.engine_checkpoint = EngineCheckpoint()
        self._engines: list[weakref.ref] = []
        self._trained: weakref.ref | None = None
        #: the handles of each engine's casts, from building it until ``wrap_model`` hands them over
        self._hooks: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()
        self._batch_sizes: list[int] = []
        self._norm: torch.Tensor | None = None

    @property
    def distributed_type(self) -> DistributedType | None:
        """``DistributedType.DEEPSPEED``."""
        return DistributedType.DEEPSPEED

    # -- building engines --------------------------------------------------------------------------
    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Build the engine for the model, optimizer and scheduler among ``objects`` (one of each at most);
        return ``objects`` with the engine, its optimizer and its scheduler in their places."""
        for obj in objects:
            if isinstance(obj, DataLoader):
                self._remember_batch_size(obj)
        models = [i for i, obj in enumerate(objects) if isinstance(obj, nn.Module) and not is_engine(obj)]
        optimizers = [i for i, obj in enumerate(objects) if isinstance(obj, DummyOptim) or _plain_optimizer(obj)]
        schedulers = [i for i, obj in enumerate(objects) if isinstance(obj, DummyScheduler) or _plain_scheduler(obj)]
        if not (models or optimizers or schedulers):
            return objects
        problems = []
        for kind, found in (("models", models), ("optimizers", optimizers), ("schedulers", schedulers)):
            if len(found) > 1:
                problems.append(f"prepare() got {len(found)} {kind}; DeepSpeed builds one engine per model: prepare "
                                "each model with its optimizer and scheduler in its own prepare() call (choose each "
                                "one's plugin with accelerator.state.select_deepspeed_plugin(name))")
        if (optimizers or schedulers) and not models:
            problems.append("prepare() got an optimizer or scheduler without its model; DeepSpeed builds the model, "
                            "optimizer and scheduler into one engine: pass them to the same prepare() call")
        if schedulers and not optimizers:
            problems.append("prepare() got a scheduler without its optimizer; pass both to the same prepare() call")
        if problems:
            raise ValueError("cannot prepare these objects with DeepSpeed:\n  - " + "\n  - ".join(problems))
        optimizer = objects[optimizers[0]] if optimizers else None
        scheduler = objects[schedulers[0]] if schedulers else None
        engine, ds_optimizer, ds_scheduler = self._build(objects[models[0]], optimizer, scheduler)
        result = list(objects)
        result[models[0]] = engine
        if optimizers or schedulers:
            wrapper = DeepSpeedOptimizerWrapper(ds_optimizer)
            if optimizers:
                result[optimizers[0]] = wrapper
            if schedulers:
                result[schedulers[0]] = DeepSpeedSchedulerWrapper(ds_scheduler, wrapper)
        return result

    def _remember_batch_size(self, loader: DataLoader) -> None:
        size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            if self.settings.split_batches:
                size = max(1, size // world_size())
            self._batch_sizes.append(size)

    def _build(self, model: nn.Module, optimizer: Any, scheduler: Any) -> tuple[Any, Any, Any]:
        deepspeed = import_deepspeed()
        selection = self.context.plugin_selection
        plugin = selection.plugin if selection is not None else next(iter(self.settings.plugins.values()))
        problems: list[str] = []
        client_optimizer, parameters, optimizer_values = _optimizer_parts(plugin, optimizer, scheduler, problems)
        client_scheduler, scheduler_values = _scheduler_parts(plugin, scheduler, optimizer_values.get("lr"),
                                                              self.settings.split_batches, problems)
        training = optimizer is not None or "optimizer" in plugin.deepspeed_config
        config = engine_config(
            plugin, mixed_precision=self.settings.mixed_precision, accumulation_steps=self.settings.accumulation_steps,
            micro_batch=self._micro_batch(plugin), world_size=world_size(), optimizer_values=optimizer_values,
            scheduler_values=scheduler_values, hidden_size=_hidden_size(model), cpu=self.device.type == "cpu",
            client_optimizer=client_optimizer is not None, training=training, problems=problems)
        if problems:
            raise ValueError("cannot build the DeepSpeed engine:\n  - " + "\n  - ".join(problems))
        self._ready()
        engine, ds_optimizer, ds_scheduler = self._model_path(model, client_optimizer, parameters, client_scheduler,
                                                              config, deepspeed)
        self._engines.append(weakref.ref(engine))
        if training:  # (a ZeRO-3 engine without an optimizer has a stand-in one)
            self._trained = weakref.ref(engine)
        return engine, ds_optimizer, ds_scheduler

    def _model_path(self, model: nn.Module, optimizer: Any, parameters: Any, scheduler: Any,
                    config: dict[str, Any], deepspeed: Any) -> tuple[Any, Any, Any]:
        """DeepSpeed's model path: the transforms every strategy shares (tensor parallel, activation
        checkpointing, compile), then the engine, which places the model, runs its precision (its bf16 / fp16
        block; no fp8) and its data parallelism (ZeRO); the engine's input / output casts are recorded for
        :meth:`wrap_model` to hand over."""
        self.apply_model_transforms(model)
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=parameters, lr_scheduler=scheduler, config=config,
            dist_init_required=False)
        self._hooks[engine] = _cast_io(engine, config)
        return engine, ds_optimizer, ds_scheduler

    def _micro_batch(self, plugin: Any) -> int | None:
        if not self._batch_sizes:
            return None
        return min(self._batch_sizes) if plugin.is_train_batch_min else max(self._batch_sizes)

    def _ready(self) -> None:
        """A process group (DeepSpeed needs one even for one process) and DeepSpeed on our device type."""
        # DeepSpeed insists on LOCAL_RANK, which torchrun sets and SLURM / MPI / one process do not
        os.environ.setdefault("LOCAL_RANK", str(self.settings.local_rank))
        if not dist.is_initialized():
            dist.init_process_group(backend_for(self.device), store=dist.HashStore(), rank=0, world_size=1)
        if self.device.type == "cpu":
            from deepspeed.accelerator import get_accelerator, set_accelerator  # lazy: optional dependency

            current = get_accelerator()
            assert current is not None  # it sets one when none is (DeepSpeed's module default is None)
            if current.device_name() != "cpu":  # Accelerator(cpu=True) on a machine with a GPU
                from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator  # lazy: optional dependency

                set_accelerator(CPU_Accelerator())

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """An engine for ``model`` alone (inference), or ``model`` if ``prepare_together`` built it; the handles
        of the engine's casts go to ``hooks``."""
        engine = model if is_engine(model) else self._build(model, None, None)[0]
        hooks += self._hooks.pop(engine, [])
        return engine

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside an engine (``model`` itself if it is not one)."""
        return model.module if is_engine(model) else model

    # -- the step ----------------------------------------------------------------------------------
    def _training_engine(self) -> Any:
        return self._trained() if self._trained is not None else None

    def backward(self, loss: torch.Tensor, precision: AmpPrecision, sync_gradients: bool, **kwargs: Any) -> None:
        """The engine's backward (``loss`` is already divided over the window) and, when the window ends, its
        step."""
        engine = self._training_engine()
        if engine is None:  # only inference engines: nothing of DeepSpeed's trains
            precision.backward(loss, **kwargs)
            return
        engine.set_gradient_accumulation_boundary(sync_gradients)
        kwargs.setdefault("scale_wrt_gas", False)  # the Accelerator divided already, unless the caller says
        engine.backward(loss, **kwargs)
        if sync_gradients:
            # ZeRO stage 0 with a torch optimizer keeps no norm; its gradients are whole on every rank here
            self._norm = _gradient_norm(engine.module) if engine.zero_optimization_stage() == 0 else None
            engine.step()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """The global gradient norm of the engine's last step. DeepSpeed clips inside ``engine.step()`` to the
        config's ``gradient_clipping``; ``max_norm`` does not change it (NaN: DeepSpeed computed no norm)."""
        engine = self._training_engine()
        norm = engine.get_global_grad_norm() if engine is not None else None
        norm = self._norm if norm is None else norm
        return torch.as_tensor(float("nan") if norm is None else norm, dtype=torch.float32)



def _plain_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, (DeepSpeedOptimizerWrapper,
                                                                           AcceleratedOptimizer))


def _plain_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) and not isinstance(obj, DeepSpeedSchedulerWrapper)


def _optimizer_parts(plugin: Any, optimizer: Any, scheduler: Any,
                     problems: list[str]) -> tuple[Any, Any, dict[str, Any]]:
    """(the optimizer DeepSpeed uses as it is, the parameters it builds the config's optimizer on, the values
    that fill the config's "auto")."""
    source, in_config = plugin.config_source, "optimizer" in plugin.deepspeed_config
    if isinstance(optimizer, DummyOptim):
        if not in_config:
            problems.append(f"DummyOptim stands for the optimizer of the DeepSpeed config, but {source} has no "
                            "\"optimizer\" block; add one, or pass a torch optimizer")
        return None, optimizer.params, optimizer.values()
    if optimizer is None:
        return None, None, {}
    values = _optimizer_values(optimizer)
    if not in_config:
        return optimizer, None, values
    # the config's optimizer replaces the torch one, which lends its values and parameters
    if scheduler is not None and not isinstance(scheduler, DummyScheduler):
        problems.append(f"{source} has an \"optimizer\" block, which replaces the torch optimizer that the scheduler "
                        "passed to prepare() was built on; use DummyScheduler(optimizer, lr_scheduler_callable=...) "
                        "or a \"scheduler\" block")
    return None, [{"params": group["params"]} for group in optimizer.param_groups], values


def _scheduler_parts(plugin: Any, scheduler: Any, lr: float | None, split_batches: bool,
                     problems: list[str]) -> tuple[Any, dict[str, Any]]:
    """(the scheduler, or callable building it, that DeepSpeed uses; the values that fill the config's "auto")."""
    source, in_config = plugin.config_source, "scheduler" in plugin.deepspeed_config
    if not isinstance(scheduler, DummyScheduler):
        if scheduler is not None and in_config:
            problems.append(f"prepare() got a torch scheduler and {source} has a \"scheduler\" block; keep one "
                            "(DummyScheduler stands for the config's)")
        return scheduler, {}
    build = scheduler.lr_scheduler_callable
    if build is not None and in_config:
        problems.append(f"DummyScheduler(lr_scheduler_callable=...) and the \"scheduler\" block of {source} both "
                        "define the scheduler; keep one")
    if build is None and not in_config:
        problems.append(f"DummyScheduler stands for the scheduler of the DeepSpeed config, but {source} has no "
                        "\"scheduler\" block; add one, or give DummyScheduler(lr_scheduler_callable=...)")
    total = scheduler.total_num_steps
    if total is not None and not split_batches:
        total = math.ceil(total / world_size())  # its steps count one-process batches
    return build, {"warmup_min_lr": 0, "warmup_max_lr": lr, "warmup_num_steps": scheduler.warmup_num_steps,
                   "total_num_steps": total, **scheduler.kwargs}


def _optimizer_values(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A torch optimizer's settings that fill "auto" in the config's optimizer block."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    return {key: group.get(key, optimizer.defaults.get(key)) for key in ("lr", "betas", "eps", "weight_decay", "momentum")
            if group.get(key, optimizer.defaults.get(key)) is not None}


def _gradient_norm(module: nn.Module) -> torch.Tensor | None:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None


def _hidden_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    sizes = getattr(config, "hidden_sizes", None)
    if size is None and sizes:
        size = max(sizes)
    return size if isinstance(size, int) else None


def _cast_io(engine: Any, config: dict[str, Any]) -> list[Any]:
    """Cast floating inputs to the engine's 16-bit dtype and floating outputs back to fp32."""
    dtype = (torch.bfloat16 if (config.get("bf16") or {}).get("enabled") is True
             else torch.float16 if (config.get("fp16") or {}).get("enabled") is True else None)
    if dtype is None:
        return []

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if tensor.is_floating_point() else tensor

    def inputs(module: nn.Module, args: Any, kwargs: Any) -> Any:
        return recursively_apply(cast, args), recursively_apply(cast, kwargs)

    def outputs(module: nn.Module, args: Any, output: Any) -> Any:
        return convert_to_fp32(output)

    return [engine.module.register_forward_pre_hook(inputs, with_kwargs=True),
            engine.module.register_forward_hook(outputs)]
