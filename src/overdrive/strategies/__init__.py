"""How training is parallel: one module per strategy, chosen by name from the registry."""

from overdrive.strategies.base import (
    Strategy,
    StrategyBase,
    StrategyContext,
    create_strategy,
    register_strategy,
)

__all__ = ["Strategy", "StrategyBase", "StrategyContext", "create_strategy", "register_strategy"]
