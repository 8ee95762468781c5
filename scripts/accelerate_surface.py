"""Accelerate's public surface, read from its source, and which of its names resolve under the alias.

    python scripts/accelerate_surface.py [PACKAGE_ROOT]   # print the names that do not resolve under the alias

``PACKAGE_ROOT`` is an Accelerate source tree's ``accelerate`` package folder (an sdist's ``src/accelerate``);
by default the installed Accelerate's. The names are read from the files (nothing of Accelerate is imported),
so any release can be enumerated beside another installed one. The check imports each module as
``accelerate.<path>`` after ``overdrive.install_as_accelerate()`` in a fresh interpreter.

Exit status 1 when a name neither resolves nor is in overdrive's absent list
(``overdrive.compat.surface_absent.ABSENT_NAMES``), or when the absent list names one that resolves.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: parts of the package left out of the surface: Accelerate's own test helpers and its interactive menu
EXCLUDED = ("test_utils", "commands.menu")
#: module-level names that are plumbing, not surface
_PLUMBING = frozenset({"TYPE_CHECKING"})


def _module_name(package_root: Path, path: Path) -> str:
    parts = [package_root.name, *path.relative_to(package_root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.stmt) -> list[str]:
    """The names a module-level statement binds (definitions, assignments, and a package's re-exports)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _reexports(node: ast.stmt, folder: Path) -> list[str]:
    """The names a package's ``from .x import y`` binds (submodules, ``from .utils import rich``, left out)."""
    if not (isinstance(node, ast.ImportFrom) and node.level > 0):
        return []
    base = folder
    for _ in range(node.level - 1):
        base = base.parent
    base = base.joinpath(*node.module.split(".")) if node.module else base
    return [alias.asname or alias.name for alias in node.names if alias.name != "*"
            and not (base / f"{alias.name}.py").is_file() and not (base / alias.name / "__init__.py").is_file()]


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The module's top-level statements, with those inside module-level ``if`` / ``try`` blocks."""
    found: list[ast.stmt] = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If):
            found += _statements(node.body) + _statements(node.orelse)
        elif isinstance(node, ast.Try):
            found += _statements(node.body) + _statements(node.orelse)
            for handler in node.handlers:
                found += _statements(handler.body)
    return found


def module_public_names(path: Path, is_package: bool) -> set[str]:
    """The public names one source file defines at module level (a package ``__init__`` also counts the
    names it imports from its own submodules: ``from accelerate.utils import X`` is how users reach them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in _statements(tree.body):
        names.update(_targets(node))
        if is_package:
            names.update(_reexports(node, path.parent))
    return {name for name in names if not name.startswith("_") and name not in _PLUMBING}


def public_names(package_root: str | Path) -> dict[str, set[str]]:
    """Accelerate's public surface: module (``accelerate.utils.operations``) -> the public names it defines
    (functions, classes, constants, its ``logger``) or, for a package, re-exports; ``test_utils`` and the
    interactive menu left out. ``package_root`` is the ``accelerate`` package folder of a source tree."""
    package_root = Path(package_root)
    surface: dict[str, set[str]] = {}
    for path in sorted(package_root.rglob("*.py")):
        module = _module_name(package_root, path)
        inner = module.removeprefix(package_root.name + ".")
        if any(inner == part or inner.startswith(part + ".") for part in EXCLUDED):
            continue
        surface[module] = module_public_names(path, path.name == "__init__.py")
    return surface


def installed_package_root() -> Path:
    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        raise SystemExit("the real Accelerate is not installed here: pass its package folder (src/accelerate)")
    return Path(spec.origin).parent


_CHECK = """
import importlib, json, sys, warnings
sys.path.insert(0, sys.argv[1])
import overdrive
overdrive.install_as_accelerate()
warnings.simplefilter("ignore")
surface = json.load(sys.stdin)
missing = {}
for module, names in surface.items():
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:
        # a served module without names that needs an optional package (utils.rich, as Accelerate's) resolves
        if names or getattr(error, "name", None) == module:
            missing[module] = sorted(names) or ["<module>"]
        continue
    gone = [name for name in names if not hasattr(loaded, name)]
    if gone:
        missing[module] = sorted(gone)
json.dump(missing, sys.stdout)
"""


def unresolved(surface: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> the names of ``surface`` that do not resolve as ``accelerate.<module>.<name>`` under the
    alias (a module that does not import lists all its names, or ``<module>`` when it has none)."""
    payload = json.dumps({module: sorted(names) for module, names in surface.items()})
    done = subprocess.run([sys.executable, "-c", _CHECK, str(ROOT / "src")], input=payload, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the alias check failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from overdrive.compat.surface_absent import ABSENT_NAMES

    package_root = Path(argv[0]) if argv else installed_package_root()
    surface = public_names(package_root)
    missing = unresolved(surface)
    problems = 0
    for module, names in sorted(missing.items()):
        for name in names:
            dotted = f"{module}.{name}"
            known = ABSENT_NAMES.get(dotted)
            print(f"{dotted}\t{'absent: ' + known if known else 'UNRESOLVED'}")
            problems += known is None
    stale = sorted(set(ABSENT_NAMES) - {f"{m}.{n}" for m, names in missing.items() for n in names})
    for dotted in stale:
        print(f"{dotted}\tlisted as absent but resolves (or is no longer in the surface)")
    total = sum(len(names) for names in surface.values())
    print(f"{total} public names in {len(surface)} modules; {sum(len(n) for n in missing.values())} unresolved, "
          f"{len(ABSENT_NAMES)} listed absent", file=sys.stderr)
    return 1 if problems or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
