"""How training is parallel: one module per strategy, chosen by name from the registry."""

from overdrive.strategies.base import (
    StrategyBase,
    StrategyContext,
    create_strategy,
    register_strategy,
)

__all__ = ["StrategyBase", "StrategyContext", "create_strategy", "register_strategy"]
