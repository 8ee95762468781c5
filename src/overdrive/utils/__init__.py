"""The names users import from ``accelerate.utils``, under ``overdrive.utils``.

Every name comes from the one compat table (``overdrive.compat.table.NAMES["overdrive.utils"]``) and is
imported on first use, so that ``from overdrive.utils import set_seed`` loads only what it needs.
"""

from __future__ import annotations

import importlib
from typing import Any


def _table() -> dict[str, str]:
    from overdrive.compat.table import NAMES

    return NAMES["overdrive.utils"]


def __getattr__(name: str) -> Any:
    module = _table().get(name)
    if module is None:
        raise AttributeError(f"module 'overdrive.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(_table())
