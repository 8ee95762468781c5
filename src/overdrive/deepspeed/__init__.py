"""Compat path: DeepSpeed support lives in ``overdrive.strategies.deepspeed``; these names stay here."""

from __future__ import annotations

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "DummyOptim": "overdrive.strategies.deepspeed.objects",
    "DummyScheduler": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedOptimizerWrapper": "overdrive.strategies.deepspeed.objects",
    "DeepSpeedSchedulerWrapper": "overdrive.strategies.deepspeed.objects",
    "get_active_deepspeed_plugin": "overdrive.strategies.deepspeed.objects",
    "import_deepspeed": "overdrive.config.deepspeed",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
