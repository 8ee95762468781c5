"""One process: the model path (placement, precision hooks, fp8, tensor parallel, activation
checkpointing, compile) and nothing more."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from overdrive.resolve import SingleSettings
from overdrive.strategies.base import LocalGradients, StrategyContext
from overdrive.transforms.path import apply_model_path


class SingleDeviceStrategy(LocalGradients):
    """One process (also the base of :class:`~overdrive.strategies.ddp.DDPStrategy`): the model path
    without a data-parallel step; gradients need no synchronisation (``LocalGradients``)."""

    name = "single"
    settings_type: type = SingleSettings
    distributed_type = None
    engine_checkpoint = None

    def __init__(self, context: StrategyContext, settings: Any = None) -> None:
        self.context = context
        self.device = context.device
        self.settings = settings

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False) -> nn.Module:
        """The model path (placement, precision hooks, fp8, tensor parallel, activation checkpointing,
        compile), ending with :meth:`data_parallel` unless ``evaluation_mode``."""
        c = self.context
        return apply_model_path(model, c.mesh, c.transforms, device=c.device if device_placement else None,
                                precision=c.precision, hooks=c.hooks, fp8_replaced=c.fp8_replaced,
                                data_parallel=None if evaluation_mode else self.data_parallel)

    def data_parallel(self, model: nn.Module) -> nn.Module:
        """The last step of the model path: one process has nothing to replicate."""
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """``model`` itself: every transform of the model path works in place."""
        return model

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over ``parameters``: every gradient is whole in this process."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """``optimizer`` as it is: the model path keeps the user's parameters."""
        return optimizer  # the wrapped model trains the user's own parameters

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """``objects`` as they are: nothing is built from several objects at once."""
        return objects  # each object is prepared on its own

