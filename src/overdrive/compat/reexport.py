"""The machinery of the thin modules at Accelerate's dotted paths.

Each thin module holds two lines::

    from overdrive.compat.reexport import exports
    __getattr__, __dir__, __all__ = exports(__name__)

and its names come from :data:`overdrive.compat.table.NAMES`, each imported from the overdrive module that
defines it on first use (PEP 562), so a thin module is never a copy and costs nothing until used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from overdrive._lazy import lazy_exports


def exports(module_name: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for the thin module ``module_name``, from the table."""
    from overdrive.compat.table import NAMES

    names = sorted(NAMES[module_name])
    __getattr__, _ = lazy_exports(module_name, NAMES[module_name])

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
