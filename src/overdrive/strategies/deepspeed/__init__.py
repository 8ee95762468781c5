"""DeepSpeed ZeRO as a strategy: the strategy (``strategy``), the config one engine is built with
(``ds_config``), DummyOptim / DummyScheduler and the wrappers (``objects``), the engine's checkpoints
(``checkpoint``). The plugin itself is ``overdrive.config.DeepSpeedPlugin``; the resolver's step is
``overdrive.resolve.deepspeed``. Nothing here imports the ``deepspeed`` library until an engine is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "DeepSpeedStrategy": "overdrive.strategies.deepspeed.strategy",
    "DummyOptim": "overdrive.strategies.deepspeed.objects",
    "DummyScheduler": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedOptimizerWrapper": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedSchedulerWrapper": "overdrive.strategies.deepspeed.objects",
    "get_active_deepspeed_plugin": "overdrive.strategies.deepspeed.objects",
    "engine_config": "overdrive.strategies.deepspeed.ds_config",
    "import_deepspeed": "overdrive.config.deepspeed",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.config.deepspeed import import_deepspeed
    from overdrive.strategies.deepspeed.ds_config import engine_config
    from overdrive.strategies.deepspeed.objects import (
        DeepSpeedOptimizerWrapper,
        DeepSpeedSchedulerWrapper,
        DummyOptim,
        DummyScheduler,
        get_active_deepspeed_plugin,
    )
    from overdrive.strategies.deepspeed.strategy import DeepSpeedStrategy
