"""The trackers a launched script will ask for, found before any worker starts, so that a missing tracker package
(``wandb`` and the like) is named once by the launcher instead of by every worker after its start-up.

Two places name them without running the script. Its own arguments (``--log_with NAME``, ``--report_to NAME``,
the flags of Accelerate's and transformers' example scripts) are certain: a missing package there is refused.
A literal ``log_with=`` keyword in its source (``Accelerator(log_with="wandb")``) is a guess: the line may sit in
a function the run never reaches (``accelerate launch`` starts such a script), so it is one warning line and
the script starts. A keyword inside an ``if``, a conditional expression or an exception handler is not even
that. Unknown names are left to the script, which may give them its own meaning; ``"all"`` starts only the
installed trackers and ``"none"`` none.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

FLAGS = ("--log_with", "--report_to")
_SKIPPED = {"all", "none"}
_CONDITIONAL = (ast.If, ast.IfExp, ast.ExceptHandler, ast.Match, ast.BoolOp)


def tracker_problems(script: str | None, script_args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings): one line per named tracker whose package is not installed, saying where it was
    named and what to install; a problem when the script's arguments name it, a warning when only its source
    does."""
    problems: list[str] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for found, into in ((_from_arguments(script_args), problems), (_from_source(script), warnings)):
        for name, where in found:
            missing = _missing(name.lower(), seen)
            if missing:
                into.append(f"the {name.lower()!r} tracker ({where}) needs the {missing!r} package, which is not "
                            f"installed: pip install {missing}; or choose another tracker")
    return problems, [f"{line} (the script starts: the line may not run)" for line in warnings]


def _missing(name: str, seen: set[str]) -> str | None:
    """The pip name of the first package tracker ``name`` lacks; None when it lacks none, when it was seen
    before, or when it is not a tracker overdrive knows."""
    # lazy: the trackers' table loads only when a script names a tracker
    from overdrive.tracking.base import is_package_available, tracker_class, tracker_names

    if name in _SKIPPED or name not in tracker_names() or name in seen:
        return None
    seen.add(name)
    for module, pip in getattr(tracker_class(name), "required_packages", ()):
        if not is_package_available(module):
            return pip
    return None


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
