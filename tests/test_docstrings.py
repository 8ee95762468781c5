"""Every public module, function, class and method of ``src/overdrive`` has a docstring.

A method that overrides a documented one (a tracker's ``log``, a module's ``forward``) inherits its
docstring (``inspect.getdoc``). Compat modules that only re-export names define nothing and so are not
checked. Private names (a leading underscore, in the name or in the module path) are left out. Checked:
each public module, its public functions and classes, and each class's methods, class methods, static
methods and properties (dataclass fields are values, not methods).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types

import pytest

import overdrive


def _modules() -> list[str]:
    names = ["overdrive"]
    for info in pkgutil.walk_packages(overdrive.__path__, "overdrive."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _defined_here(obj: object, module: str) -> bool:
    return getattr(obj, "__module__", None) == module


def _missing_in(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = [] if inspect.getdoc(module) else [module_name]
    for name, obj in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        if not _defined_here(obj, module_name):
            continue  # re-exported: checked where it is defined
        qualified = f"{module_name}.{name}"
        if not inspect.getdoc(obj):
            missing.append(qualified)
        if inspect.isclass(obj):
            fields = getattr(obj, "__dataclass_fields__", {})
            for attr, member in vars(obj).items():
                if attr.startswith("_") or attr in fields:  # a dataclass field's default is not a method
                    continue
                func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if (inspect.isfunction(func) or isinstance(member, property)) and not inspect.getdoc(
                        getattr(obj, attr, None) if not isinstance(member, property) else member):
                    missing.append(f"{qualified}.{attr}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    # every module imports without its optional dependencies (they are imported inside functions), so an
    # ImportError here is a bug to report, not a module to pass over
    missing = sorted(name for module in _modules() for name in _missing_in(module))
    assert not missing, f"{len(missing)} public names without a docstring:\n  " + "\n  ".join(missing)


_PROBE = '''
def documented():
    """Yes."""

def undocumented():
    pass

class Documented:
    """Yes."""

    def method(self):
        pass

    @property
    def value(self):
        return 1

    @classmethod
    def build(cls):
        pass

    @staticmethod
    def helper():
        pass

    def run(self):
        """Yes."""

    def _private(self):
        pass

class Child(Documented):
    """Yes."""

    def run(self):  # inherits Documented.run's docstring
        pass

    def method(self):  # nothing to inherit
        pass

    def extra(self):
        pass
'''


def test_the_check_sees_functions_methods_and_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("overdrive.docstring_probe")
    exec(compile(_PROBE, "<probe>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    expected = ["undocumented", "Documented.method", "Documented.value", "Documented.build",
                "Documented.helper", "Child.method", "Child.extra"]
    assert sorted(_missing_in(module.__name__)) == sorted(
        ["overdrive.docstring_probe", *(f"overdrive.docstring_probe.{name}" for name in expected)])
