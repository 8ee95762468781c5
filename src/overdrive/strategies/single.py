"""One process: the model path with no step overridden (placement, precision hooks, fp8, tensor
parallel, activation checkpointing, compile) and nothing more."""

from __future__ import annotations

from overdrive.resolve import SingleSettings
from overdrive.strategies.base import StrategyBase


class SingleDeviceStrategy(StrategyBase):
    """One process (also the base of :class:`~overdrive.strategies.ddp.DDPStrategy`): every default of
    :class:`StrategyBase`; gradients need no synchronisation."""

    name = "single"
    settings_type = SingleSettings
