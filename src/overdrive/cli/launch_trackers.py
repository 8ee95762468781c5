"""The trackers a launched script will ask for, found before any worker starts, so that a missing tracker package
(``wandb`` and the like) is refused once by the launcher instead of by every worker after its start-up.

Two places name them without running the script: its own arguments (``--log_with NAME``, ``--report_to NAME``,
the flags of Accelerate's and transformers' example scripts) and literal ``log_with=`` keywords in its source
(``Accelerator(log_with="wandb")``). A keyword inside an ``if``, a conditional expression or an exception handler
is left out: the script may not reach it. Unknown names are left to the script, which may give them its own
meaning; ``"all"`` starts only the installed trackers and ``"none"`` none.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

FLAGS = ("--log_with", "--report_to")
_SKIPPED = {"all", "none"}
_CONDITIONAL = (ast.If, ast.IfExp, ast.ExceptHandler, ast.Match, ast.BoolOp)


def tracker_problems(script: str | None, script_args: Sequence[str]) -> list[str]:
    """One line per named tracker whose package is not installed: where it was named and what to install."""
    from overdrive.tracking.base import is_package_available, tracker_class, tracker_names

    known = set(tracker_names())
    problems: list[str] = []
    seen: set[str] = set()
    for name, where in [*_from_arguments(script_args), *_from_source(script)]:
        name = name.lower()
        if name in _SKIPPED or name not in known or name in seen:
            continue
        seen.add(name)
        for module, pip in getattr(tracker_class(name), "required_packages", ()):
            if not is_package_available(module):
                problems.append(f"the {name!r} tracker ({where}) needs the {pip!r} package, which is not installed: "
                                f"pip install {pip}; or choose another tracker")
    return problems


def _from_arguments(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """Names after ``--log_with`` / ``--report_to`` (``=value``, comma-separated, or several values)."""
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        if flag not in FLAGS:
            continue
        values = [inline] if inline else []
        if not inline:
            for value in args[i + 1:]:
                if value.startswith("-"):
                    break
                values.append(value)
        for value in values:
            for name in value.split(","):
                if name.strip():
                    yield name.strip(), f"script argument {flag} {value}"


def _from_source(script: str | None) -> Iterator[tuple[str, str]]:
    """String constants given as ``log_with=`` (alone or in a list or tuple) outside any condition."""
    if not script or not script.endswith(".py"):
        return
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return  # the script's own start reports what is wrong with it
    yield from _visit(tree, Path(script).name, conditional=False)


def _visit(node: ast.AST, filename: str, conditional: bool) -> Iterator[tuple[str, str]]:
    conditional = conditional or isinstance(node, _CONDITIONAL)
    if isinstance(node, ast.keyword) and node.arg == "log_with" and not conditional:
        values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.value, f"log_with={value.value!r} in {filename} line {value.lineno}"
    for child in ast.iter_child_nodes(node):
        yield from _visit(child, filename, conditional)
