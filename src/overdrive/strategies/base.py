"""The strategy base class and its registry.

A strategy wraps models for its kind of parallelism and answers the few questions the Accelerator
asks of it. :class:`StrategyBase` holds the defaults (one process's answers); a strategy overrides what
differs. Its ``wrap_model`` is its model path, read top to bottom: the ``apply_*`` steps of
``transforms/path.py`` in order, the ones every strategy shares after placement and precision in
:meth:`StrategyBase.apply_model_transforms`. A new strategy is one module plus one ``register_strategy`` call.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from overdrive.config import DistributedType
from overdrive.training.accumulation import NO_CONTEXT
from overdrive.transforms.path import Replaced, model_blocks

if TYPE_CHECKING:
    from overdrive.precision.amp import AmpPrecision
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.training.accumulation import AccumulationWindow
    from overdrive.training.prepared import PreparedObjects
    from overdrive.training.state import PluginSelection
    from overdrive.transforms.settings import ModelTransforms

#: a transform of one's own: changes the model in place (its return value is ignored)
Transform = Callable[[nn.Module], object]


@dataclass(frozen=True, slots=True, eq=False)
class StrategyContext:
    """The runtime objects every strategy works with."""

    device: torch.device
    mesh: ParallelMesh
    #: the Accelerator's autocast hooks and loss scaler
    precision: AmpPrecision
    #: the model path's settings, the same for every strategy
    transforms: ModelTransforms
    window: AccumulationWindow
    #: parameters fp8 conversion replaced (``id(old) -> (weakref(old), new)``), for ``prepare_optimizer``
    fp8_replaced: Replaced = field(default_factory=dict)
    #: which of the plan's named plugins the next ``prepare()`` uses (DeepSpeed's), or None: runtime state
    #: owned by the Accelerator's state, so the plan stays frozen
    plugin_selection: PluginSelection | None = None


class StrategyBase:
    """What the Accelerator needs from a kind of parallelism, with one process's answers as defaults: the
    user's parameters and module as they are, the precision's ``backward`` (the loss scaler's under fp16) and
    no gradient synchronisation to control. ``wrap_model`` has no default: it is each strategy's model path.

    A strategy subclasses it, names its settings type, and overrides what differs; ``create_strategy``
    builds it as ``cls(context, settings)``."""

    #: the registry name
    name: ClassVar[str] = "base"
    #: the type of the settings this strategy takes (a dataclass in ``resolve/plan.py``); others are refused
    settings_type: ClassVar[type] = object
    #: whether ``backward`` does more than ``precision.backward(loss)`` (DeepSpeed: the engine's backward and
    #: step); when False and no loss scale is used, the Accelerator calls ``loss.backward()`` itself (one call
    #: per micro-batch instead of three: it is the hot path)
    owns_backward: ClassVar[bool] = False
    #: what the refusal of a model on the meta device suggests besides materialising it
    meta_remedy: ClassVar[str] = ""
    #: an engine that keeps the state of the models, optimizers and schedulers it owns in its own checkpoint
    #: format (DeepSpeed), saved into and loaded from the checkpoint folder; None for the others
    engine_checkpoint: EngineCheckpoint | None = None

    def __init__(self, context: StrategyContext, settings: Any) -> None:
        self.context = context
        self.device = context.device
        self.settings = settings
        #: transforms of one's own, run in order by :meth:`apply_model_transforms` after activation
        #: checkpointing, before compile and data parallel (``accelerator.strategy.extra_transforms.append(f)``)
        self.extra_transforms: list[Transform] = []

    @property
    def distributed_type(self) -> DistributedType | None:
        """What ``Accelerator.distributed_type`` reports; None: the device's MULTI_* (or NO)."""
        return None

    @property
    def no_sync_does_nothing(self) -> bool:
        """Whether ``no_sync`` is the shared do-nothing context (the Accelerator then skips calling it)."""
        return type(self).no_sync is StrategyBase.no_sync

    # -- the objects ----------------------------------------------------------------------------------
    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Everything given to one ``prepare()`` call, before each object is prepared on its own; returns the
        list with the objects this strategy builds together replaced (DeepSpeed: model, optimizer and
        scheduler become an engine, its optimizer and its scheduler). By default ``objects`` as they are."""
        return objects

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """The model as it trains under this strategy: its model path, the ``apply_*`` steps in order. The
        handles of the hooks it adds are appended to ``hooks`` (the Accelerator files them with the prepared
        model, or removes them if preparing fails). ``evaluation_mode`` leaves out a data-parallel wrapper that
        only serves training (DDP)."""
        raise NotImplementedError(f"{type(self).__name__} has no model path: a strategy defines wrap_model "
                                  "(see strategies/single.py)")

    def apply_model_transforms(self, model: nn.Module, find_blocks: bool = False) -> list[nn.Module]:
        """The steps every strategy runs after placement and precision, in place: tensor parallel, activation
        checkpointing, :attr:`extra_transforms`, compile. Returns the model's blocks (found after tensor
        parallel) when a step uses them or ``find_blocks`` asks (``fully_shard``'s wrap policy reads them),
        else an empty list. A subclass adds a step by extending it."""
        transforms, tp_mesh = self.context.transforms, self.context.mesh.get("tp")
        if tp_mesh is not None:
            # lazy: its import (DTensor's styles) costs every start-up that has no tensor parallel
            from overdrive.transforms.tensor_parallel import apply_tensor_parallel, tensor_parallel_plan

            plan = tensor_parallel_plan(model, tp_mesh.size(), transforms.tp_plan, transforms.sequence_parallel)
            apply_tensor_parallel(model, tp_mesh, plan)
        uses_blocks = find_blocks or transforms.activation_checkpointing or transforms.compile is not None
        blocks = model_blocks(model, transforms) if uses_blocks else []
        if transforms.activation_checkpointing:
            # lazy: a run without activation checkpointing or compile never loads them (first-step import cost)
            from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(blocks, model)
        for transform in self.extra_transforms:
            transform(model)
        if transforms.compile is not None:
            from overdrive.transforms.compile import apply_compile  # lazy: as activation checkpointing

            apply_compile(model, blocks, transforms.compile)
        return blocks

    def apply_fp8(self, model: nn.Module) -> Replaced:
        """The model's linear layers converted for fp8 (the plan's recipe) in place; the parameters replaced,
        also recorded in the context's ``fp8_replaced`` for the optimizers."""
        # lazy: the fp8 module is imported only by runs with an fp8 recipe (its import costs every other start)
        from overdrive.precision.fp8 import apply_fp8

        assert self.context.transforms.fp8 is not None  # the caller's condition
        replaced = apply_fp8(model, self.context.transforms.fp8)
        self.context.fp8_replaced.update(replaced)
        return replaced

    def places_model(self, device_placement: bool) -> bool:
        """Whether :meth:`wrap_model` puts the model on the device, given ``prepare``'s ``device_placement``."""
        return device_placement

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``wrap_model`` returned: ``model`` itself by default, since every
        ``apply_*`` step but data parallel works in place."""
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """The optimizer pointed at the parameters the wrapped ``models`` train (sharding replaces them); by
        default ``optimizer`` as it is: the model path keeps the user's parameters."""
        return optimizer

    def track_prepared(self, prepared: PreparedObjects) -> None:
        """Called once with the Accelerator's registry of prepared objects, which a strategy that moves the
        training state between processes reads (fault-tolerant training heals a group from it); by default
        nothing."""

    def data_place(self, num_processes: int, process_index: int) -> tuple[int, int]:
        """How many shards a prepared data loader splits the data into and which one this process reads,
        given the data-parallel size and rank; by default those."""
        return num_processes, process_index

    def gathered_remainder(self, remainder: int, total_batch_size: int) -> int:
        """How many of the samples ``gather_for_metrics`` collects from the last batch are real (not repeated to
        fill it), given the loader's ``remainder`` over all its shards; by default ``remainder``: the gather
        reaches every shard."""
        return remainder

    def loader_hook(self) -> Callable[[Any], None] | None:
        """What a prepared data loader calls as each iteration begins (``before_epoch``); None by default."""
        return None

    # -- gradients ------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, precision: AmpPrecision, sync_gradients: bool, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (already divided over the accumulation window): by default
        ``precision.backward(loss)`` (the loss scaler's backward under fp16)."""
        precision.backward(loss, **kwargs)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally, without synchronising them across processes; by default a context
        that does nothing: there is nothing to hold back."""
        return NO_CONTEXT  # (shared: it holds no state; no object is built per micro-batch)

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Synchronise gradients in this backward even inside ``no_sync``; by default a context that does
        nothing: every backward already synchronises what it must."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient (across processes) and return that norm; by default
        ``torch.nn.utils.clip_grad_norm_``: every gradient is whole in this process."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


class EngineCheckpoint(Protocol):
    """A strategy's engine state inside a checkpoint folder (see ``StrategyBase.engine_checkpoint``)."""

    def owns(self, obj: Any) -> bool:
        """Whether the engine saves the state of ``obj`` (a prepared model, optimizer or scheduler)."""
        ...

    def save(self, folder: Path, models: list[nn.Module], accelerate: bool = False) -> None:
        """Write the engines' state into ``folder`` (still the temporary one), where Accelerate's ``save_state``
        writes it when ``accelerate``; every rank calls it."""

    def load(self, folder: Path, models: list[nn.Module], allow_pickle: bool = False,
             scheduler_states: bool = True) -> None:
        """Restore what ``save`` wrote (the engine's scheduler too unless ``scheduler_states`` is False); every
        rank calls it."""

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s full weights on the CPU by the user's names (rank 0 at least); every rank calls it."""
        ...


# name -> "module:attribute", imported on first use so unused strategies cost nothing at import.
_REGISTRY: dict[str, str | type[StrategyBase]] = {
    "single": "overdrive.strategies.single:SingleDeviceStrategy",
    "ddp": "overdrive.strategies.ddp:DDPStrategy",
    "fsdp2": "overdrive.strategies.fsdp2:FSDP2Strategy",
    "deepspeed": "overdrive.strategies.deepspeed:DeepSpeedStrategy",
    "pipeline": "overdrive.strategies.pipeline:PipelineStrategy",
    "ft_ddp": "overdrive.strategies.fault_tolerant:FaultTolerantStrategy",
    "ft_fsdp2": "overdrive.strategies.fault_tolerant_fsdp2:FaultTolerantFSDP2Strategy",
}


def register_strategy(name: str, factory: str | type[StrategyBase]) -> None:
    """Add a strategy under ``name``: a :class:`StrategyBase` subclass, or a ``"module:attribute"`` path to one."""
    if not isinstance(factory, str) and not (isinstance(factory, type) and issubclass(factory, StrategyBase)):
        raise TypeError(f"register_strategy({name!r}, {factory!r}): a strategy is a subclass of "
                        "overdrive.strategies.StrategyBase (or a 'module:attribute' path to one)")
    _REGISTRY[name] = factory


def create_strategy(name: str, context: StrategyContext, settings: Any) -> StrategyBase:
    """Build the strategy registered as ``name`` with its own ``settings`` (of its ``settings_type``; other
    settings are refused)."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown strategy {name!r}; registered strategies: {', '.join(sorted(_REGISTRY))}")
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        if not (isinstance(factory, type) and issubclass(factory, StrategyBase)):
            raise TypeError(f"strategy {name!r} ({_REGISTRY[name]}) is not a subclass of StrategyBase")
        _REGISTRY[name] = factory
    expected = factory.settings_type
    if not isinstance(settings, expected):
        raise TypeError(f"strategy {name!r} takes {expected.__name__} settings, got {type(settings).__name__}")
    return factory(context, settings)
