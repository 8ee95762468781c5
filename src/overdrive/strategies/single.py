"""One process: the model on the device, autocast, fp8, then the transforms every strategy shares (tensor
parallel, activation checkpointing, compile); gradients need no synchronisation."""

from __future__ import annotations

from typing import Any

from torch import nn

from overdrive.resolve import SingleSettings
from overdrive.strategies.base import StrategyBase
from overdrive.transforms.path import apply_placement, apply_precision_hooks


class SingleDeviceStrategy(StrategyBase):
    """One process (also the base of :class:`~overdrive.strategies.ddp.DDPStrategy`): every default of
    :class:`StrategyBase`."""

    name = "single"
    settings_type = SingleSettings

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """The one-process model path (DDP's until its data parallel step)."""
        if device_placement:
            model = apply_placement(model, self.device, self.meta_remedy)
        hooks += apply_precision_hooks(model, self.context.precision)
        if self.context.transforms.fp8 is not None and device_placement:  # torchao's float8 weights: not on meta
            self.apply_fp8(model)
        self.apply_model_transforms(model)
        return model
