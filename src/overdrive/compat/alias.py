"""``install_as_accelerate()``: make ``import accelerate`` give overdrive, in this process only.

A finder placed first on ``sys.meta_path`` answers every ``accelerate.<path>`` listed in
:data:`overdrive.compat.table.MODULES` with the overdrive module of the same path, the very same module
object, so ``isinstance`` checks and the process-wide states agree whichever name a library imported.
``accelerate`` itself is a view of the ``overdrive`` package (every attribute read, set and deleted there)
whose only own value is ``__version__``: the Accelerate release overdrive follows, so that scripts comparing
``accelerate.__version__`` (diffusers' training examples register their checkpoint hooks that way) take
the branch written for that release, while ``overdrive.__version__`` stays overdrive's own. The same finder
answers ``importlib.metadata`` for the distribution ``accelerate`` with that release, so libraries' version
checks (``is_accelerate_available``, ``require_version``) pass whether or not the real package is installed.

Nothing changes for a process that does not call it (PyMySQL's ``install_as_MySQLdb()`` is the model).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import os
import pathlib
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from overdrive.compat.table import ACCELERATE_VERSION, MODULES, REMOVED, REMOVED_MODULES, removed_warning

__all__ = ["install_as_accelerate", "uninstall_as_accelerate", "is_installed_as_accelerate", "AccelerateAliasError",
           "AccelerateModule"]


class AccelerateAliasError(RuntimeError):
    """The alias cannot be installed (the real Accelerate is already imported in this process)."""


class AccelerateModule(ModuleType):
    """``accelerate`` under the alias: the ``overdrive`` package seen under Accelerate's name. Reading,
    setting (``mock.patch("accelerate.X")``) and deleting a name act on ``overdrive`` itself; the module's
    own entries are its import bookkeeping (``__spec__``, ``__path__``, ...) and ``__version__``."""

    _OWN = frozenset({"__name__", "__doc__", "__version__", "__spec__", "__loader__", "__path__", "__file__",
                      "__package__", "__cached__", "__dict__", "__class__"})

    def __init__(self, target: ModuleType) -> None:
        super().__init__("accelerate", target.__doc__)
        vars(self).update(_target=target, __version__=ACCELERATE_VERSION, __spec__=target.__spec__,
                          __path__=list(getattr(target, "__path__", [])), __file__=target.__file__,
                          __package__="accelerate")

    def __getattr__(self, name: str) -> Any:
        removed = REMOVED["overdrive"].get(name)
        if removed is not None:
            warnings.warn(removed_warning(f"accelerate.{name}", *removed), DeprecationWarning, stacklevel=2)
        return getattr(vars(self)["_target"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            super().__setattr__(name, value)
        else:
            setattr(vars(self)["_target"], name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._OWN:
            super().__delattr__(name)
        else:
            delattr(vars(self)["_target"], name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(vars(self)["_target"])) | {"__version__"})


class _AliasLoader(importlib.abc.Loader):
    """Hands out an already imported overdrive module under its Accelerate name."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.own_spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamps the alias spec on the module; the module keeps its own identity
        # (its __spec__ names overdrive), so reload() and pickling by module name still work.
        module.__spec__ = self.own_spec


class _AccelerateDistribution(metadata.Distribution):
    """The metadata of the Accelerate release overdrive stands in for."""

    # the real release's fields (libraries read them: sentence-transformers checks Home-page names
    # huggingface before it trains); the body says who answers
    _CLASSIFIERS = ("Development Status :: 5 - Production/Stable", "Intended Audience :: Developers",
                    "Intended Audience :: Education", "Intended Audience :: Science/Research",
                    "License :: OSI Approved :: Apache Software License", "Operating System :: OS Independent",
                    "Programming Language :: Python :: 3", "Programming Language :: Python :: 3.11",
                    "Topic :: Scientific/Engineering :: Artificial Intelligence")
    _REQUIRES = ("numpy>=1.17", "packaging>=20.0", "psutil", "pyyaml", "torch>=2.6.0", "huggingface_hub>=0.21.0",
                 "safetensors>=0.4.3")
    _EXTRAS = ("quality", "docs", "test-prod", "test-dev", "testing", "deepspeed", "rich", "test-fp8",
               "test-trackers", "dev", "sagemaker")
    _METADATA = "".join((
        f"Metadata-Version: 2.1\nName: accelerate\nVersion: {ACCELERATE_VERSION}\nSummary: Accelerate\n",
        "Home-page: https://github.com/huggingface/accelerate\nAuthor: The Hugging Face team\n",
        "Author-email: transformers@huggingface.co\nLicense: Apache\nKeywords: deep learning\n",
        *(f"Classifier: {c}\n" for c in _CLASSIFIERS),
        "Requires-Python: >=3.11.0\nDescription-Content-Type: text/markdown\n",
        *(f"Requires-Dist: {r}\n" for r in _REQUIRES), *(f"Provides-Extra: {e}\n" for e in _EXTRAS),
        "\noverdrive standing in for Accelerate (overdrive.install_as_accelerate)\n"))

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return self._METADATA
        if filename == "top_level.txt":
            return "accelerate\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Any:
        return pathlib.Path(__file__).parent / path


class _AccelerateFinder(importlib.abc.MetaPathFinder):
    """``accelerate[.<path>]`` -> ``overdrive[.<path>]`` for the paths in the table."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        target_name = MODULES.get(fullname)
        if target_name is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: overdrive (installed as accelerate) has no counterpart of this "
                "Accelerate module; the supported paths are listed in overdrive.compat.table.MODULES "
                "and docs/accelerate_parity.md", name=fullname)
        if fullname in REMOVED_MODULES:
            warnings.warn(removed_warning(fullname, *REMOVED_MODULES[fullname]), DeprecationWarning, stacklevel=2)
        module = importlib.import_module(target_name)
        if fullname == "accelerate":
            module = AccelerateModule(module)
        own = module.__spec__
        locations = own.submodule_search_locations if own is not None else None
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=locations is not None)
        if locations is not None:
            spec.submodule_search_locations = list(locations)
        return spec

    def find_distributions(self, context: Any = None) -> Iterator[metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalize(name) == "accelerate":
            yield _AccelerateDistribution()


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


_finder: _AccelerateFinder | None = None


def is_installed_as_accelerate() -> bool:
    """Whether ``install_as_accelerate()`` is in effect in this process."""
    return _finder is not None and _finder in sys.meta_path


def _real_accelerate_modules() -> list[str]:
    overdrive_modules = {id(m) for name, m in sys.modules.items() if name.split(".")[0] == "overdrive"}
    return sorted(name for name, module in sys.modules.items()
                  if (name == "accelerate" or name.startswith("accelerate.")) and id(module) not in overdrive_modules
                  and not isinstance(module, AccelerateModule))


def install_as_accelerate() -> None:
    """Make ``import accelerate`` (and every ``accelerate.<path>`` in the table) import overdrive, and
    ``accelerate.__version__`` and ``importlib.metadata.version("accelerate")`` answer the Accelerate release
    overdrive follows, in this process. Call it before importing transformers, PEFT, TRL or diffusers::

        import overdrive
        overdrive.install_as_accelerate()
        from transformers import Trainer  # Trainer now runs on overdrive

    Calling it twice is harmless. Raises ``AccelerateAliasError`` (and changes nothing) when the real
    Accelerate is already imported in this process.
    """
    global _finder
    if is_installed_as_accelerate():
        return
    real = _real_accelerate_modules()
    if real:
        shown = ", ".join(real[:3]) + (", ..." if len(real) > 3 else "")
        raise AccelerateAliasError(
            f"install_as_accelerate(): the real Accelerate is already imported in this process ({shown}), so "
            "objects from both would mix; call overdrive.install_as_accelerate() before anything imports "
            "accelerate (before transformers, peft, trl), or run the script with "
            "'overdrive launch --as_accelerate script.py'")
    _finder = _AccelerateFinder()
    sys.meta_path.insert(0, _finder)


def uninstall_as_accelerate() -> None:
    """Undo ``install_as_accelerate()``: ``import accelerate`` finds the real package again (if installed).

    Libraries that already imported names from ``accelerate`` keep the overdrive objects they hold."""
    global _finder
    if _finder is not None:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        module = sys.modules[name]
        if getattr(getattr(module, "__spec__", None), "name", "").split(".")[0] == "overdrive":
            del sys.modules[name]
