"""Accelerate's dotted paths under ``overdrive`` (``overdrive.hooks``, ``overdrive.utils.dataclasses``,
``overdrive.commands.launch``, ...), served from the one table (:mod:`overdrive.compat.table`) instead of
files: no thin module exists on disk.

A finder first on ``sys.meta_path`` answers each path the table lists (and only those: no file exists at
them, and a stale ``__pycache__`` folder left where a thin package once was must not shadow them as an
empty namespace package):

- a path in :data:`~overdrive.compat.table.NAMES` gets a module built on first import, whose names are
  imported from their overdrive modules on first use (PEP 562), so the module is never a copy and costs
  nothing until a name is read; a path with listed sub-paths (``overdrive.utils``) is a package;
- a path in :data:`~overdrive.compat.table.SAME_MODULE` gets the overdrive module kept elsewhere, the very
  same object (``overdrive.utils.random`` is ``overdrive.helpers.random``).

``install_as_accelerate()`` then hands these modules out under ``accelerate.<path>``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from overdrive._lazy import lazy_exports

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["install_served_paths", "served_paths", "SERVED_ROOTS"]

#: the first part of every served path (``overdrive.<root>[...]``): the finder reads the table only for these,
#: so that importing overdrive's own modules never loads it (tests/compat/test_accelerate_compat.py checks
#: this against the table)
SERVED_ROOTS = frozenset({"utils", "hooks", "big_modeling", "inference", "data_loader", "checkpointing",
                          "parallelism_config", "commands", "test_utils", "local_sgd", "logging", "state",
                          "memory_utils",
                          "optimizer", "scheduler"})


def served_paths() -> list[str]:
    """Every ``overdrive.<path>`` this finder serves (the table's thin modules and its same-module paths)."""
    # lazy: import overdrive loads this module; the table loads only when a served path is used
    from overdrive.compat.table import NAMES, SAME_MODULE

    return sorted({*NAMES, *SAME_MODULE} - {"overdrive"})


class _ServedLoader:
    """Builds the module of one served path from its row of the table (the loader protocol of PEP 451; no
    ``importlib.abc`` base: importing that module would load importlib.resources at every ``import overdrive``)."""

    def __init__(self, same_module: str | None) -> None:
        self.same_module = same_module
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def __repr__(self) -> str:
        return "served from overdrive.compat.table"

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        if self.same_module is None:
            return None  # the import system makes a plain module
        module = importlib.import_module(self.same_module)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self.same_module is not None:
            # the import system stamped the served spec on it: the module keeps its own identity
            module.__spec__ = self.own_spec
            return
        # lazy: import overdrive loads this module; the table loads only when a served path is used
        from overdrive.compat.table import NAMES, REMOVED

        names = NAMES[module.__name__]
        module.__doc__ = (f"``accelerate{module.__name__[len('overdrive'):]}`` under overdrive: names served from "
                          "overdrive.compat.table, each imported from its overdrive module on first use.")
        getter, _ = lazy_exports(module.__name__, names)
        removed = REMOVED.get(module.__name__)
        if removed:
            getter = _warning_on(removed, module.__name__, names, getter)
        vars(module).update(__all__=sorted(names), __getattr__=getter, __dir__=lambda: sorted(names))
        if module.__name__ == "overdrive.big_modeling":  # what is assigned there replaces dispatch_model's check
            from overdrive import big_model  # lazy: `import overdrive` loads the finder alone

            big_model.device_map_check_sources.append(module)


def _warning_on(removed: dict[str, tuple[str, str]], module: str, names: dict[str, str],
                getter: Any) -> Any:
    """``getter`` (a module ``__getattr__``), but a name Accelerate removed warns at every read (never cached)."""

    def __getattr__(name: str) -> Any:
        if name not in removed:
            return getter(name)

        # lazy: import overdrive loads this module; the table loads only when a served path is used
        from overdrive.compat.table import removed_warning

        dotted = f"accelerate{module[len('overdrive'):]}.{name}"
        warnings.warn(removed_warning(dotted, *removed[name]), DeprecationWarning, stacklevel=2)
        path, _, attribute = names[name].partition(":")
        return getattr(importlib.import_module(path), attribute or name)

    return __getattr__


class _ServedFinder:  # the meta path finder protocol (no importlib.abc base: see _ServedLoader)
    """``overdrive.<path>`` for the paths of the table that no file provides."""

    #: True while the table itself is being imported (its own import passes through this finder)
    busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if parts[0] != "overdrive" or len(parts) < 2 or parts[1] not in SERVED_ROOTS or self.busy:
            return None
        self.busy = True
        try:
            # lazy: import overdrive loads this module; the table loads only when a served path is used
            from overdrive.compat.table import NAMES, SAME_MODULE
        finally:
            self.busy = False

        same = SAME_MODULE.get(fullname)
        if same is None and fullname not in NAMES:
            return None
        if same is not None:
            own = importlib.import_module(same).__spec__
            is_package = own is not None and own.submodule_search_locations is not None
        else:
            is_package = any(other.startswith(fullname + ".") for other in (*NAMES, *SAME_MODULE))
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _ServedLoader(same)), is_package=is_package)


_finder = _ServedFinder()


def install_served_paths() -> None:
    """Serve the table's paths (``import overdrive`` calls this once; calling it again changes nothing)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
