"""Loaded at start-up by every Python process of an ``accelerate_suite.py`` run (this folder is first on
PYTHONPATH), so the pytest process and every process its tests start (``accelerate launch``, ``torchrun``,
``debug_launcher``'s children) see the same ``accelerate``.

Does nothing unless ``ACCELERATE_SUITE_SIDE`` is set. Then:

- ``accelerate.test_utils`` and its submodules are loaded from the sdist's ``src/accelerate/test_utils``
  (``ACCELERATE_SUITE_TEST_UTILS``), on both sides, and ``path_in_accelerate_package`` points into the same
  sdist, so the scripts the tests launch (test_script.py, test_sync.py, ...) are the sdist's own;
- with ``ACCELERATE_SUITE_SIDE=overdrive``, ``overdrive.install_as_accelerate()`` runs first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

_PACKAGE = "accelerate.test_utils"


class _SdistLoader(importlib.abc.Loader):
    """Wraps the sdist file's own loader; re-points ``path_in_accelerate_package`` at the sdist."""

    def __init__(self, inner: importlib.abc.Loader, sdist_package: Path) -> None:
        self.inner = inner
        self.sdist_package = sdist_package

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        if module.__name__ == f"{_PACKAGE}.testing":
            package = self.sdist_package

            def path_in_accelerate_package(*components: str) -> Path:
                """The sdist's ``src/accelerate/<components>`` (the scripts the suite launches)."""
                return package.joinpath(*components)

            module.path_in_accelerate_package = path_in_accelerate_package


class _SdistTestUtilsFinder(importlib.abc.MetaPathFinder):
    """``accelerate.test_utils[.<path>]`` from the sdist, ahead of every other finder."""

    def __init__(self, test_utils: Path) -> None:
        self.test_utils = test_utils

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PACKAGE and not fullname.startswith(_PACKAGE + "."):
            return None
        where = self.test_utils.joinpath(*fullname.split(".")[2:])
        if where.is_dir():
            spec = importlib.util.spec_from_file_location(fullname, where / "__init__.py",
                                                          submodule_search_locations=[str(where)])
        else:
            spec = importlib.util.spec_from_file_location(fullname, where.with_suffix(".py"))
        if spec is None or spec.loader is None or not Path(str(spec.origin)).exists():
            return None
        spec.loader = _SdistLoader(spec.loader, self.test_utils.parent)
        return spec


def _install() -> None:
    side = os.environ.get("ACCELERATE_SUITE_SIDE")
    if not side:
        return
    if side == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    test_utils = os.environ.get("ACCELERATE_SUITE_TEST_UTILS")
    if test_utils:
        sys.meta_path.insert(0, _SdistTestUtilsFinder(Path(test_utils)))


_install()
