"""The strategy protocol and its registry.

A strategy wraps models for its kind of parallelism and answers the few questions the Accelerator
asks of it. A new strategy is one module plus one ``register_strategy`` call.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from overdrive.accumulation import NO_CONTEXT
from overdrive.config import DistributedType

if TYPE_CHECKING:
    from overdrive.accumulation import AccumulationWindow
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.state import PluginSelection
    from overdrive.transforms.hooks import HookRegistry
    from overdrive.transforms.path import ModelTransforms


@dataclass(frozen=True)
class StrategyContext:
    """The runtime objects every strategy works with (its settings are its own typed object)."""

    device: torch.device
    mesh: ParallelMesh
    #: the Accelerator's ``AmpPrecision``: autocast hooks and the loss scaler
    precision: Any
    #: the model path's settings, the same for every strategy
    transforms: ModelTransforms
    #: where the hooks put on prepared models are filed, so unwrap_model / free_memory remove them
    hooks: HookRegistry
    window: AccumulationWindow
    #: parameters fp8 conversion replaced (``id(old) -> (weakref(old), new)``), for ``prepare_optimizer``
    fp8_replaced: dict[int, Any] = field(default_factory=dict)
    #: which of the plan's named plugins the next ``prepare()`` uses (DeepSpeed's), or None: runtime state
    #: owned by the Accelerator's state, so the plan stays frozen
    plugin_selection: PluginSelection | None = None


class Strategy(Protocol):
    """What the Accelerator needs from a kind of parallelism."""

    name: str
    #: what ``Accelerator.distributed_type`` reports; None: the device's MULTI_* (or NO).
    distributed_type: DistributedType | None
    #: an engine that keeps the state of the models, optimizers and schedulers it owns in its own checkpoint
    #: format (DeepSpeed), saved into and loaded from the checkpoint folder; None for the others.
    engine_checkpoint: EngineCheckpoint | None
    #: whether ``backward`` does more than ``precision.backward(loss)`` (DeepSpeed: the engine's backward and
    #: step); when False and no loss scale is used, the Accelerator calls ``loss.backward()`` itself (one call
    #: per micro-batch instead of three: it is the hot path). A strategy without the attribute counts as True.
    owns_backward: bool

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Everything given to one ``prepare()`` call, before each object is prepared on its own; returns the
        list with the objects this strategy builds together replaced (DeepSpeed: model, optimizer and
        scheduler become an engine, its optimizer and its scheduler). Identity for the others."""
        ...

    def backward(self, loss: torch.Tensor, precision: Any, sync_gradients: bool, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (already divided over the accumulation window): ``precision.backward``,
        or an engine's backward, which also steps at the end of a window (``sync_gradients``)."""

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False) -> nn.Module:
        """The model as it trains under this strategy: the model path (``transforms.path``) run on it.
        ``evaluation_mode`` leaves out a data-parallel wrapper that only serves training (DDP)."""
        ...

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``wrap_model`` returned."""
        ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally, without synchronising them across processes."""
        ...

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Synchronise gradients in this backward even inside ``no_sync``."""
        ...

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient (across processes) and return that norm."""
        ...

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """The optimizer pointed at the parameters the wrapped ``models`` train (sharding replaces them)."""
        ...


class LocalGradients:
    """The gradient half of :class:`Strategy` for strategies that need no per-backward control of gradient
    synchronisation: ``backward`` is the precision's (the loss scaler's under fp16), ``no_sync`` and
    ``sync_in_backward`` are contexts that do nothing. One process has nothing to synchronise; a pipeline's
    schedule reduces at each step's end; DeepSpeed's engine is told in its own ``backward``."""

    owns_backward = False  # backward is the precision's: loss.backward(), scaled under fp16

    def backward(self, loss: torch.Tensor, precision: Any, sync_gradients: bool, **kwargs: Any) -> None:
        """``precision.backward(loss)`` (the loss scaler's backward under fp16)."""
        precision.backward(loss, **kwargs)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """A context that does nothing: there is nothing to hold back."""
        return NO_CONTEXT  # (shared: it holds no state; no object is built per micro-batch)

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """A context that does nothing: every backward already synchronises what it must."""
        return contextlib.nullcontext()


class EngineCheckpoint(Protocol):
    """A strategy's engine state inside a checkpoint folder (see ``Strategy.engine_checkpoint``)."""

    def owns(self, obj: Any) -> bool:
        """Whether the engine saves the state of ``obj`` (a prepared model, optimizer or scheduler)."""
        ...

    def save(self, folder: Path, models: list[nn.Module]) -> None:
        """Write the engines' state into ``folder`` (still the temporary one); every rank calls it."""

    def load(self, folder: Path, models: list[nn.Module], allow_pickle: bool = False) -> None:
        """Restore what ``save`` wrote; every rank calls it."""

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s full weights on the CPU by the user's names (rank 0 at least); every rank calls it."""
        ...


# name -> "module:attribute", imported on first use so unused strategies cost nothing at import.
_REGISTRY: dict[str, str | Callable[..., Strategy]] = {
    "single": "overdrive.strategies.single:SingleDeviceStrategy",
    "ddp": "overdrive.strategies.ddp:DDPStrategy",
    "fsdp2": "overdrive.strategies.fsdp2:FSDP2Strategy",
    "deepspeed": "overdrive.strategies.deepspeed:DeepSpeedStrategy",
    "pipeline": "overdrive.strategies.pipeline:PipelineStrategy",
}


def register_strategy(name: str, factory: str | Callable[..., Strategy]) -> None:
    """Add a strategy under ``name``: a callable, or a ``"module:attribute"`` path to one."""
    _REGISTRY[name] = factory


def create_strategy(name: str, context: StrategyContext, settings: Any) -> Strategy:
    """Build the strategy registered as ``name`` with its own ``settings`` (a strategy class may name their
    type as ``settings_type``; other settings are refused)."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown strategy {name!r}; registered strategies: {', '.join(sorted(_REGISTRY))}")
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        _REGISTRY[name] = factory
    expected = getattr(factory, "settings_type", None)
    if expected is not None and not isinstance(settings, expected):
        raise TypeError(f"strategy {name!r} takes {expected.__name__} settings, got {type(settings).__name__}")
    return factory(context, settings)
