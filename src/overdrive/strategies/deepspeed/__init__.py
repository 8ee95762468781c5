"""DeepSpeed ZeRO as a strategy, with its configuration beside it: the plugin and its DeepSpeed JSON
(``config``: ``DeepSpeedPlugin``; ``hf_config``: ``HfDeepSpeedConfig``), the config settled against the run
(``settle``: against the Accelerator's arguments when the plan is made, "auto" values from the prepared
objects when an engine is built), the strategy (``strategy``), DummyOptim / DummyScheduler and the wrappers
(``objects``), the engine's checkpoints (``checkpoint``). Nothing here imports the ``deepspeed`` library
until an engine is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "DeepSpeedPlugin": "overdrive.strategies.deepspeed.config",
    "import_deepspeed": "overdrive.strategies.deepspeed.config",
    "HfDeepSpeedConfig": "overdrive.strategies.deepspeed.hf_config",
    "DeepSpeedSettings": "overdrive.strategies.deepspeed.settle",
    "engine_config": "overdrive.strategies.deepspeed.settle",
    "DeepSpeedStrategy": "overdrive.strategies.deepspeed.strategy",
    "DummyOptim": "overdrive.strategies.deepspeed.objects",
    "DummyScheduler": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedOptimizerWrapper": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedSchedulerWrapper": "overdrive.strategies.deepspeed.objects",
    "get_active_deepspeed_plugin": "overdrive.strategies.deepspeed.objects",
}
__all__ = sorted([*_EXPORTS, "resolve_deepspeed"])
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.strategies.deepspeed.config import DeepSpeedPlugin, import_deepspeed
    from overdrive.strategies.deepspeed.hf_config import HfDeepSpeedConfig
    from overdrive.strategies.deepspeed.objects import (
        DeepSpeedOptimizerWrapper,
        DeepSpeedSchedulerWrapper,
        DummyOptim,
        DummyScheduler,
        get_active_deepspeed_plugin,
    )
    from overdrive.strategies.deepspeed.settle import DeepSpeedSettings, engine_config
    from overdrive.strategies.deepspeed.strategy import DeepSpeedStrategy


def resolve_deepspeed(plugin: Any, plugins: Any, launched: dict[str, Any], **values: Any) -> DeepSpeedSettings | None:
    """The DeepSpeed strategy's step of the plan (``settle.resolve_deepspeed``), which the Accelerator hands
    to ``resolve_training``: the resolver sits below the strategies and calls it only for a DeepSpeed run."""
    # lazy: measured import time (the plugin's modules cost ~15 ms; a run without DeepSpeed does not load them)
    from overdrive.strategies.deepspeed import settle

    return settle.resolve_deepspeed(plugin, plugins, launched, **values)
