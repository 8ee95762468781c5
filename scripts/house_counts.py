"""Count what the house rules of ARCHITECTURE.md ask to keep at zero or small, over ``src/overdrive``.

    python scripts/house_counts.py            the counts, then each place that breaks a rule
    python scripts/house_counts.py --counts   the counts only

What it counts:
- hand-written frozen values: classes deriving from ``FrozenValue`` (internal values are standard dataclasses);
- modules that use private torch API: an attribute or import below ``torch`` whose name starts with one
  underscore, or a module's private call machinery (``_compiled_call_impl``, ``_call_impl``);
- imports inside functions, and those of them without a reason: a function-level import states why it is not
  at the top with a comment holding ``lazy:`` on its lines or just above it, where one comment may give the
  reason for a group of imports (``# lazy: optional dependency``);
- functions over 80 lines.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "overdrive"
MAX_FUNCTION_LINES = 80
PRIVATE_MODULE_MACHINERY = frozenset({"_compiled_call_impl", "_call_impl"})


@dataclass
class Counts:
    """The places found, one list per rule."""

    frozen_values: list[str] = field(default_factory=list)
    private_torch: dict[str, list[str]] = field(default_factory=dict)
    function_imports: list[str] = field(default_factory=list)
    unexplained_imports: list[str] = field(default_factory=list)
    long_functions: list[str] = field(default_factory=list)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _torch_chain(node: ast.Attribute) -> list[str] | None:
    """``torch.a._b`` -> ["torch", "a", "_b"]; None when the chain does not start at the name ``torch``."""
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if isinstance(current, ast.Name) and current.id == "torch":
        return ["torch", *reversed(parts)]
    return None


def _private_uses(tree: ast.Module) -> list[str]:
    uses: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _torch_chain(node)
            if chain is not None and any(_is_private(part) for part in chain):
                uses.append(f"{node.lineno}: {'.'.join(chain)}")
            elif chain is None and node.attr in PRIVATE_MODULE_MACHINERY:
                uses.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            names = [alias.name for alias in node.names]
            if any(_is_private(part) for part in node.module.split(".")) or any(map(_is_private, names)):
                uses.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and any(map(_is_private, alias.name.split("."))):
                    uses.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = node.value.split(".")
            if parts[0] == "torch" and len(parts) > 1 and any(map(_is_private, parts)) and " " not in node.value:
                uses.append(f"{node.lineno}: '{node.value}'")
    return uses


def _has_reason(lines: list[str], node: ast.Import | ast.ImportFrom) -> bool:
    """A ``lazy:`` comment on the import's own lines, or in the comments and imports just above it (one
    comment may give the reason for a group of imports)."""
    end = node.end_lineno or node.lineno
    if any("lazy:" in line for line in lines[node.lineno - 1:end]):
        return True
    index = node.lineno - 2
    while index >= 0:
        line = lines[index].strip()
        if line.startswith("#"):
            if "lazy:" in line:
                return True
        elif not (line.startswith(("import ", "from ")) or line in (")", "") or line.endswith(",")):
            return False
        index -= 1
    return False


def count(source: Path = SOURCE) -> Counts:
    """Walk every module under ``source`` and collect the places each rule names."""
    counts = Counts()
    for path in sorted(source.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        where = str(path.relative_to(source.parent))
        private = _private_uses(tree)
        if private:
            counts.private_torch[where] = private
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [getattr(base, "id", getattr(base, "attr", "")) for base in node.bases]
                if "FrozenValue" in bases:
                    counts.frozen_values.append(f"{where}:{node.lineno} {node.name}")
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                counts.long_functions.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and inner is not node:
                    place = f"{where}:{inner.lineno}"
                    if place in counts.function_imports:
                        continue  # a nested function's import is seen from each enclosing function
                    counts.function_imports.append(place)
                    if not _has_reason(lines, inner):
                        counts.unexplained_imports.append(place)
    return counts


def main() -> int:
    """Print the counts (and, unless ``--counts``, every place behind them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", action="store_true", help="print the counts only")
    args = parser.parse_args()
    counts = count()
    rows = [
        ("FrozenValue classes", counts.frozen_values),
        ("modules using private torch API", sorted(counts.private_torch)),
        ("function-level imports", counts.function_imports),
        ("function-level imports without a 'lazy:' reason", counts.unexplained_imports),
        (f"functions over {MAX_FUNCTION_LINES} lines", counts.long_functions),
    ]
    for title, places in rows:
        print(f"{title}: {len(places)}")
    if not args.counts:
        for title, places in rows:
            if places and title != "function-level imports":
                print(f"\n{title}:")
                for place in places:
                    print(f"  {place}")
                    for use in counts.private_torch.get(place, []):
                        print(f"      {use}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
