"""The strategy protocol and its registry.

A strategy wraps models for its kind of parallelism and answers the few questions the Accelerator
asks of it. A new strategy is one module plus one ``register_strategy`` call.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
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


# name -> "module:attribute", imported on first use so unused strategies cost nothing at import.
_REGISTRY: dict[str, str | Callable[..., Strategy]] = {
    "single": "overdrive.strategies.single:SingleDeviceStrategy",
    "ddp": "overdrive.strategies.ddp:DDPStrategy",
    "fsdp2": "overdrive.strategies.fsdp2:FSDP2Strategy",
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
