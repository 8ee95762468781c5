"""One process: the model trains as it is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


class SingleDeviceStrategy:
    name = "single"
    distributed_type = None
    applies_transforms = False
    engine_checkpoint = None

    def __init__(self, **_: Any) -> None:
        pass

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        return optimizer  # the wrapped model trains the user's own parameters

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        return objects  # each object is prepared on its own

    def backward(self, loss: torch.Tensor, precision: Any, sync_gradients: bool, **kwargs: Any) -> None:
        precision.backward(loss, **kwargs)
