"""DeepSpeed support: the plugin's config handling, "auto" filling, DummyOptim / DummyScheduler, the engine's
checkpoints, and the Megatron-LM plugin's checks.

Nothing here imports the ``deepspeed`` library at import time; it is imported when an engine is built.
The strategy itself is ``overdrive.strategies.deepspeed``; see docs/deepspeed.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from overdrive.config.deepspeed import import_deepspeed  # noqa: F401 - re-exported for the strategy

_EXPORTS = {
    "DummyOptim": "overdrive.deepspeed.objects",
    "DummyScheduler": "overdrive.deepspeed.objects",
    "DeepSpeedOptimizerWrapper": "overdrive.deepspeed.objects",
    "DeepSpeedSchedulerWrapper": "overdrive.deepspeed.objects",
    "get_active_deepspeed_plugin": "overdrive.deepspeed.objects",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'overdrive.deepspeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
