"""Lazy exports (PEP 562): a package names its public objects and the modules defining them, and each
module is imported on first use. Keeps ``import overdrive`` (and ``overdrive.utils``, ...) light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: a table of ``name -> module path`` (or ``"module:attribute"`` where the object has another name there), or a
#: function returning one (called only when a name is looked up)
Exports = Mapping[str, str] | Callable[[], Mapping[str, str]]


def lazy_exports(package: str, *tables: Exports) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: on first access of ``name`` import the module the
    first table that has ``name`` names, and cache the object in the package's namespace::

        __getattr__, __dir__ = lazy_exports(__name__, {"Accelerator": "overdrive.accelerator"})

    A table given as a function is called only when a name is not found in the tables before it (so a
    large table, such as the compat one, costs nothing until a name from it is used)."""

    def lookup(name: str) -> str | None:
        for table in tables:
            module = (table() if callable(table) else table).get(name)
            if module is not None:
                return module
        return None

    def __getattr__(name: str) -> Any:
        module = lookup(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path, _, attribute = module.partition(":")
        value = getattr(importlib.import_module(path), attribute or name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        names = {name for table in tables for name in (table() if callable(table) else table)}
        return sorted(names | set(vars(sys.modules[package])))

    return __getattr__, __dir__
