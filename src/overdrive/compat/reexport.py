"""The machinery of the thin modules at Accelerate's dotted paths.

Each thin module holds two lines::

    from overdrive.compat.reexport import exports
    __getattr__, __dir__, __all__ = exports(__name__)

and its names come from :data:`overdrive.compat.table.NAMES`, each imported from the overdrive module that
defines it on first use (PEP 562), so a thin module is never a copy and costs nothing until used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(module_name: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for the thin module ``module_name``, from the table."""
    from overdrive.compat.table import NAMES

    sources = NAMES[module_name]
    names = sorted(sources)

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
