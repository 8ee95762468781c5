"""DeepSpeed support: the plugin's config handling, "auto" filling, DummyOptim / DummyScheduler, the engine's
checkpoints, and the Megatron-LM plugin's checks.

Nothing here imports the ``deepspeed`` library at import time; it is imported when an engine is built.
The strategy itself is ``overdrive.strategies.deepspeed``; see docs/deepspeed.md.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def import_deepspeed() -> Any:
    """The ``deepspeed`` library, or an error that names the package to install."""
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "DeepSpeed was asked for (DeepSpeedPlugin, --use_deepspeed or distributed_type: DEEPSPEED) but the "
            f"'deepspeed' package cannot be imported ({exc}); install it with: pip install 'overdrive[deepspeed]' "
            "(or pip install deepspeed)") from exc
    return deepspeed
