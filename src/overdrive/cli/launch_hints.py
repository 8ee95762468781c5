"""One line at start when a script written for Accelerate is launched without ``--as_accelerate`` while the real
Accelerate is installed: that library, not overdrive, then runs it. (When Accelerate is not installed, the
launcher names ``--as_accelerate`` after the script fails to import it: ``launchers/torchrun.py``.)

The script's imports are read from its source without running it; a warning, never a refusal.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

#: libraries whose training loops run on Accelerate (importing one is using Accelerate)
ON_ACCELERATE = ("accelerate", "transformers", "trl", "setfit", "sentence_transformers", "diffusers")


def accelerate_line(script: str | None) -> str | None:
    """The line to print before starting ``script`` without ``--as_accelerate``, or None."""
    imported = imported_modules(script)
    used = [name for name in ON_ACCELERATE if name in imported]
    # a script that imports overdrive may install the alias itself (overdrive.install_as_accelerate())
    if not used or "overdrive" in imported or not _installed("accelerate"):
        return None
    name = Path(str(script)).name
    via = "accelerate" if "accelerate" in used else f"{used[0]}, which runs on Accelerate,"
    return (f"overdrive launch: {name} imports {via} and the real Accelerate is installed: it runs the script, not "
            "overdrive; add --as_accelerate to run it on overdrive")


def imported_modules(script: str | None) -> set[str]:
    """The top-level names of the modules ``script`` imports anywhere in its source (empty when unreadable)."""
    if not script or not script.endswith(".py"):
        return set()
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it counts as not installed
        return False
