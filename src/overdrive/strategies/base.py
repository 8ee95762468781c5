"""The strategy protocol and its registry.

A strategy wraps models for its kind of parallelism and answers the few questions the Accelerator
asks of it. A new strategy is one module plus one ``register_strategy`` call.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from overdrive.config import DistributedType


class Strategy(Protocol):
    """What the Accelerator needs from a kind of parallelism."""

    name: str
    #: what ``Accelerator.distributed_type`` reports; None: the device's MULTI_* (or NO).
    distributed_type: DistributedType | None
    #: True when ``wrap_model`` itself places the model, applies precision and compilation (in the fixed
    #: order of the model transforms); the Accelerator then does none of them.
    applies_transforms: bool
    #: an engine that keeps the state of the models, optimizers and schedulers it owns in its own checkpoint
    #: format (DeepSpeed), saved into and loaded from the checkpoint folder; None for the others.
    engine_checkpoint: EngineCheckpoint | None

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Everything given to one ``prepare()`` call, before each object is prepared on its own; returns the
        list with the objects this strategy builds together replaced (DeepSpeed: model, optimizer and
        scheduler become an engine, its optimizer and its scheduler). Identity for the others."""

    def backward(self, loss: torch.Tensor, precision: Any, sync_gradients: bool, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (already divided over the accumulation window): ``precision.backward``,
        or an engine's backward, which also steps at the end of a window (``sync_gradients``)."""

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The model as it trains under this strategy (already on the right device)."""

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``wrap_model`` returned."""

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally, without synchronising them across processes."""

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Synchronise gradients in this backward even inside ``no_sync``."""

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient (across processes) and return that norm."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """The optimizer pointed at the parameters the wrapped ``models`` train (sharding replaces them)."""


class EngineCheckpoint(Protocol):
    """A strategy's engine state inside a checkpoint folder (see ``Strategy.engine_checkpoint``)."""

    def owns(self, obj: Any) -> bool:
        """Whether the engine saves the state of ``obj`` (a prepared model, optimizer or scheduler)."""

    def save(self, folder: Path, models: list[nn.Module]) -> None:
        """Write the engines' state into ``folder`` (still the temporary one); every rank calls it."""

    def load(self, folder: Path, models: list[nn.Module], allow_pickle: bool = False) -> None:
        """Restore what ``save`` wrote; every rank calls it."""

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s full weights on the CPU by the user's names (rank 0 at least); every rank calls it."""


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


def create_strategy(name: str, **kwargs: Any) -> Strategy:
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown strategy {name!r}; registered strategies: {', '.join(sorted(_REGISTRY))}")
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        _REGISTRY[name] = factory
    return factory(**kwargs)
