"""Compat path: DeepSpeed support lives in ``overdrive.strategies.deepspeed``; its names are reachable here
too, through that package's one table (imported on first use, like there)."""

from __future__ import annotations

from overdrive._lazy import lazy_exports
from overdrive.strategies.deepspeed import _EXPORTS

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
