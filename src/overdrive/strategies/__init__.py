"""How training is parallel: one module per strategy, chosen by name from the registry.

Names are imported on first use, so ``overdrive.DeepSpeedPlugin`` (``strategies/deepspeed/config.py``) loads
without the strategies' base and torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {name: "overdrive.strategies.base" for name in (
    "StrategyBase", "StrategyContext", "create_strategy", "register_strategy")}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.strategies.base import (
        StrategyBase,
        StrategyContext,
        create_strategy,
        register_strategy,
    )
