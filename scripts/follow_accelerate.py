"""Move overdrive to a new Accelerate release: one command, one report a developer works from.

    python scripts/follow_accelerate.py 1.17.0                  # against the release overdrive follows now
    python scripts/follow_accelerate.py 1.16.0 --from 1.15.0    # against another release
    python scripts/follow_accelerate.py 1.17.0 --no-suite       # leave out the test suite (25-55 min on 2 cores)
    python scripts/follow_accelerate.py 1.17.0 --reuse          # take each suite file's last recorded outcomes
    python scripts/follow_accelerate.py 1.17.0 --reuse-real     # the real release's only: the alias side runs

It downloads both releases' sdists and wheels (``pip download``, kept under ``.cache/follow/``) and compares:

- the public API, read from the sources (nothing imported): modules, module-level functions, classes and
  constants, each class's public methods and attributes, signatures with their defaults, dataclass fields
  with their types and defaults;
- the launch flags: ``launch_command_parser()`` of each release's wheel, run in a fresh interpreter (flag,
  default, type, choices, action; help text separately);
- the config file keys: the fields of ``commands/config/config_args.py``'s config classes and the keys the
  ``accelerate config`` questions write into their nested sections (``fsdp_config``, ``dynamo_config``...);
- which of the release's public names resolve under overdrive's alias (``scripts/accelerate_surface.py``);
- the release's own test suite (its sdist's ``tests/``, ``scripts/accelerate_suite.py``), under the real
  release (its wheel first on the path) and under the alias: what passes under each, and every test that
  passes under the real release and fails under the alias, with its error's last line and its entry in the
  known list; and the tests the release added or removed.

Writes ``docs/follow/accelerate-<VERSION>.md`` (``--output``). Exit status 0 when the report is written.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import accelerate_suite  # noqa: E402  (scripts/ is no package)

CACHE = ROOT / ".cache" / "follow"

# ---------------------------------------------------------------------------------------------------- fetching


def download(version: str, cache: Path = CACHE) -> tuple[Path, Path]:
    """``accelerate==version``'s extracted sdist (the whole tree) and unpacked wheel, downloaded once."""
    tree, wheel = cache / f"accelerate-{version}", cache / f"wheel-{version}"
    if not (tree / "src" / "accelerate").is_dir():
        archive = _pip_download(version, cache, "--no-binary", f"accelerate-{version}.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(cache, members=[m for m in tar.getmembers() if m.name.startswith(f"accelerate-{version}/")],
                           filter="data")
    if not (wheel / "accelerate").is_dir():
        archive = _pip_download(version, cache, "--only-binary", f"accelerate-{version}-py3-none-any.whl")
        with zipfile.ZipFile(archive) as package:
            package.extractall(wheel)
    return tree, wheel


def _pip_download(version: str, cache: Path, kind: str, name: str) -> Path:
    archive = cache / name
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"accelerate=={version}", kind, ":all:", "--no-deps",
                        "--disable-pip-version-check", "-q", "-d", str(cache)], check=True)
    if not archive.exists():
        raise SystemExit(f"pip download of accelerate=={version} did not leave {name} in {cache}")
    return archive

# ---------------------------------------------------------------------------------------------------- the API


def api(package_root: Path) -> dict[str, str]:
    """The public API of an ``accelerate`` source folder: dotted name -> what it is, as text to compare
    (``def gather(tensor)``, ``class Accelerator``, ``field: bool = False``, ``= 'value'``, ``module``).
    Module-level definitions count (also inside a module-level ``if`` / ``try``); a package's ``__init__``
    also counts what it imports from its own modules (``from accelerate.utils import X`` is how users reach
    them); a class's public methods and attributes count (with ``__init__`` and ``__call__``)."""
    found: dict[str, str] = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = [package_root.name, *path.relative_to(package_root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        if any(part.startswith("_") for part in parts):
            continue
        found[module] = "module"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, text in _module_entries(tree.body, package=path.name == "__init__.py"):
            found[f"{module}.{name}"] = text
    return found


def _flatten(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """A body's statements, with those of its ``if`` / ``try`` blocks (definitions made conditionally)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _flatten(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _flatten(node.body + node.orelse + node.finalbody
                                + [s for handler in node.handlers for s in handler.body])


def _public(name: str) -> bool:
    return not name.startswith("_") or name in ("__init__", "__call__")


def _module_entries(body: list[ast.stmt], package: bool) -> Iterable[tuple[str, str]]:
    for node in _flatten(body):
        if isinstance(node, ast.ClassDef) and _public(node.name):
            yield node.name, _class_text(node)
            for member, text in _class_entries(node):
                yield f"{node.name}.{member}", text
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            yield node.name, _function_text(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            yield from ((name, text) for name, text in _assigned(node) if _public(name) and name != "TYPE_CHECKING")
        elif package and isinstance(node, ast.ImportFrom) and node.level > 0:
            for alias in node.names:
                if alias.name != "*" and _public(alias.asname or alias.name):
                    yield alias.asname or alias.name, f"from {'.' * node.level}{node.module or ''} import {alias.name}"


def _class_entries(node: ast.ClassDef) -> Iterable[tuple[str, str]]:
    for member in node.body:
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(member.name):
            yield member.name, _function_text(member)
        elif isinstance(member, (ast.Assign, ast.AnnAssign)):
            yield from ((name, text) for name, text in _assigned(member) if _public(name))


def _class_text(node: ast.ClassDef) -> str:
    decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
    bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
    return f"{decorators}class {node.name}" + (f"({bases})" if bases else "")


def _function_text(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``def name(a, b=1, *, c=None)``: the parameters and defaults (annotations left out), and decorators."""
    arguments = ast.arguments(**{field: getattr(node.args, field) for field in node.args._fields})
    for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]:
        if argument is not None:
            argument.annotation = None
    decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
    return f"{decorators}def {node.name}({ast.unparse(arguments)})"


def _assigned(node: ast.Assign | ast.AnnAssign) -> Iterable[tuple[str, str]]:
    """(name, ``: type = default`` or ``= value``) of an assignment; a dataclass ``field(...)`` shows only its
    ``default`` / ``default_factory`` (its help text is no part of the API)."""
    value = _default_text(node.value) if node.value is not None else None
    if isinstance(node, ast.AnnAssign):
        if isinstance(node.target, ast.Name):
            yield node.target.id, f": {ast.unparse(node.annotation)}" + (f" = {value}" if value is not None else "")
        return
    for target in node.targets:
        for name in ([target] if isinstance(target, ast.Name) else getattr(target, "elts", [])):
            if isinstance(name, ast.Name):
                yield name.id, f"= {value}"


def _default_text(value: ast.expr) -> str:
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
        given = {k.arg: ast.unparse(k.value) for k in value.keywords}
        if "default" in given:
            return given["default"]
        return f"{given['default_factory']}()" if "default_factory" in given else "field()"
    return ast.unparse(value)

# ---------------------------------------------------------------------------------------------------- diffing


def diff(old: dict[str, str], new: dict[str, str]) -> tuple[list[str], list[str], list[tuple[str, str, str]]]:
    """(added names, removed names, [(name, old text, new text)] changed), each sorted by name."""
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = [(name, old[name], new[name]) for name in sorted(set(old) & set(new)) if old[name] != new[name]]
    return added, removed, changed


def config_keys(package_root: Path) -> dict[str, str]:
    """The config file's keys: the fields of ``commands/config/config_args.py``'s classes (``ClusterConfig.x``)
    and the keys ``commands/config/*.py`` write into a nested section (``fsdp_config.fsdp_version``)."""
    folder = package_root / "commands" / "config"
    keys = {name.removeprefix(f"{package_root.name}.commands.config.config_args."): text
            for name, text in api(package_root).items()
            if name.startswith(f"{package_root.name}.commands.config.config_args.")
            and name.count(".") == 5 and not text.startswith("def ")}
    for path in sorted(folder.glob("*.py")):
        for section, key in _section_keys(ast.parse(path.read_text(encoding="utf-8"))):
            keys.setdefault(f"{section}.{key}", f"written by commands/config/{path.name}")
    return keys


def _section_keys(tree: ast.Module) -> Iterable[tuple[str, str]]:
    """(section, key) for each ``<section>_config[...] = ...`` store, with ``prefix + "key"`` resolved from the
    nearest ``prefix = "..."`` above it in the file."""
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.Subscript))),
                   key=lambda n: (n.lineno, n.col_offset))
    strings: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
              and node.value.id.endswith("_config")):
            key = _string_of(node.slice, strings)
            if key is not None:
                yield node.value.id, key


def _string_of(node: ast.expr, strings: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_of(node.left, strings), _string_of(node.right, strings)
        return left + right if left is not None and right is not None else None
    return None

# ---------------------------------------------------------------------------------------------------- launch flags


_FLAGS = r"""
import json, sys
from accelerate.commands.launch import launch_command_parser
parser = launch_command_parser()
titles = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
flags = {}
for action in parser._actions:
    name = max(action.option_strings, key=len) if action.option_strings else action.dest
    kind = type(action).__name__.lstrip("_").removesuffix("Action")
    flags[name] = {
        "spec": f"{kind}, default={action.default!r}, type={getattr(action.type, '__name__', action.type)}"
                + (f", choices={list(action.choices)}" if action.choices else "")
                + (f", nargs={action.nargs}" if action.nargs is not None else "")
                + (f", also {', '.join(o for o in action.option_strings if o != name)}" if len(action.option_strings) > 1 else ""),
        "help": " ".join(str(action.help or "").split()), "group": titles.get(id(action), "")}
json.dump(flags, sys.stdout)
"""


def launch_flags(wheel: Path) -> dict[str, dict[str, str]]:
    """``accelerate launch``'s flags as the release's own ``launch_command_parser()`` builds them (its wheel
    first on the path, in a fresh interpreter): flag -> {"spec", "help", "group"}."""
    done = subprocess.run([sys.executable, "-c", _FLAGS], env=_clean_env(wheel), capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"launch_command_parser() of {wheel.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _clean_env(first: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(first)
    return env

# ---------------------------------------------------------------------------------------------------- the alias


def surface(old_root: Path, new_root: Path) -> dict | None:
    """Which of the new release's public names resolve under overdrive's alias (scripts/accelerate_surface.py:
    its ``public_names`` and ``unresolved``); None when this checkout has no such script."""
    try:
        import accelerate_surface
    except ImportError:
        return None
    new, old = accelerate_surface.public_names(new_root), accelerate_surface.public_names(old_root)
    missing = accelerate_surface.unresolved(new)
    unresolved = {f"{module}.{name}" for module, names in missing.items() for name in names}
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from overdrive.compat.surface_absent import ABSENT_NAMES as absent
    except ImportError:
        absent = {}
    added = {f"{module}.{name}" for module, names in new.items() for name in names - old.get(module, set())}
    return {"total": sum(len(names) for names in new.values()), "modules": len(new),
            "unresolved": {name: absent.get(name, "") for name in sorted(unresolved)},
            "added": {name: name not in unresolved for name in sorted(added)}}

# ---------------------------------------------------------------------------------------------------- the suite


def test_ids(tree: Path) -> set[str]:
    """The test functions of a sdist's ``tests/`` as written (``tests/test_x.py::Class::test_y``; a
    parameterized test counts once)."""
    ids = set()
    for path in sorted((tree / "tests").rglob("test_*.py")):
        where = path.relative_to(tree).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                ids.add(f"{where}::{node.name}")
            elif isinstance(node, ast.ClassDef):
                ids.update(f"{where}::{node.name}::{member.name}" for member in node.body
                           if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and member.name.startswith("test"))
    return ids


def run_suite(version: str, wheel: Path, cache: Path, files: list[str] | None, reuse: set[str],
              timeout: int) -> dict:
    """The release's suite under the real release (its wheel first on the path) and under the alias: the
    outcomes of each side, the files, and the alias side's errors. ``reuse``: the sides whose recorded outcomes
    are taken, file by file, where the cache has them."""
    tree = accelerate_suite.fetch(cache, version)
    files = files or sorted(p.name for p in (tree / "tests").glob("test_*.py"))
    results = {}
    for side in accelerate_suite.SIDES:
        print(f"{side} side of accelerate=={version}'s suite ({len(files)} files)", flush=True)
        results[side], _ = accelerate_suite.run_side(side, tree, files, cache, timeout, side in reuse,
                                                     accelerate_path=wheel if side == "accelerate" else None)
    return {"files": files, "results": results, "errors": accelerate_suite.read_errors("overdrive", files, cache)}

# ---------------------------------------------------------------------------------------------------- the report


def _code(text: str, limit: int = 150) -> str:
    """``text`` as inline code fit for a Markdown table cell (one line, pipes escaped, long text cut)."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _folded(added: list[str]) -> list[tuple[str, int]]:
    """The added names whose module or class is not added too, each with how many added names it holds."""
    wanted = set(added)
    rows: dict[str, int] = {}
    for name in added:
        parts = name.split(".")
        top = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in wanted), name)
        rows[top] = rows.get(top, 0) + (top != name)
    return sorted(rows.items())


def _changes(title: str, old: dict[str, str], new: dict[str, str], what: str) -> list[str]:
    """A section listing what ``new`` adds to, removes from and changes in ``old`` (dotted name -> text)."""
    added, removed, changed = diff(old, new)
    lines = [f"## {title}", "", f"{len(old)} {what} before, {len(new)} now: {len(added)} new, {len(removed)} "
             f"removed, {len(changed)} changed.", ""]
    if added:
        lines += ["### New", "", "| name | what |", "|---|---|"]
        lines += [f"| `{name}` | {_code(new[name])}" + (f" (and {count} more {'name' if count == 1 else 'names'} in it)" if count else "") + " |"
                  for name, count in _folded(added)]
        lines.append("")
    if removed:
        lines += ["### Removed", "", "| name | what it was |", "|---|---|"]
        lines += [f"| `{name}` | {_code(old[name])}" + (f" (and {count} more {'name' if count == 1 else 'names'} in it)" if count else "") + " |"
                  for name, count in _folded(removed)]
        lines.append("")
    if changed:
        lines += ["### Changed", "", "| name | was | now |", "|---|---|---|"]
        lines += [f"| `{name}` | {_code(before)} | {_code(after)} |" for name, before, after in changed]
        lines.append("")
    return lines


def _flag_sections(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]]) -> list[str]:
    lines = _changes("`accelerate launch` flags (`launch_command_parser()`)", {k: v["spec"] for k, v in old.items()},
                     {k: f"{v['spec']} ({v['group']}): {v['help']}" if k not in old else v["spec"]
                      for k, v in new.items()}, "flags")
    helped = sorted(k for k in set(old) & set(new) if old[k]["help"] != new[k]["help"])
    if helped:
        lines += ["Help text changed: " + ", ".join(f"`{k}`" for k in helped) + ".", ""]
    return lines


def _surface_section(found: dict | None) -> list[str]:
    lines = ["## Public names under overdrive's alias", ""]
    if found is None:
        return lines + ["Skipped: this checkout has no `scripts/accelerate_surface.py` (it enumerates the public "
                        "names and checks them under the alias).", ""]
    unresolved, added = found["unresolved"], found["added"]
    lines += [f"{found['total']} public names in {found['modules']} modules (`test_utils` and the menu left out); "
              f"{len(unresolved)} do not resolve under the alias, {sum(1 for r in unresolved.values() if r)} of "
              f"them listed as absent with a reason. New in this release: {len(added)}, of which "
              f"{sum(added.values())} resolve.", ""]
    if added:
        lines += ["| new name | resolves under the alias |", "|---|---|"]
        lines += [f"| `{name}` | {'yes' if ok else '**no**'} |" for name, ok in added.items()]
        lines.append("")
    if unresolved:
        lines += ["| does not resolve | absent because |", "|---|---|"]
        lines += [f"| `{name}` | {reason or '**not listed**'} |" for name, reason in unresolved.items()]
        lines.append("")
    return lines


def _added_tests(old: set[str], new: set[str]) -> list[str]:
    lines = []
    for title, names in (("added", sorted(new - old)), ("removed", sorted(old - new))):
        by_file: dict[str, list[str]] = {}
        for name in names:
            where, _, test = name.partition("::")
            by_file.setdefault(where, []).append(test)
        lines += [f"Tests the release {title} ({len(names)}, as written; read the added ones for changed "
                  "behaviour):" if title == "added" else f"Tests the release {title} ({len(names)}):", ""]
        lines += [f"- `{where}`: " + ", ".join(f"`{t}`" for t in tests) for where, tests in sorted(by_file.items())]
        lines.append("")
    return lines


def _suite_section(version: str, found: dict | None, old_tests: set[str], new_tests: set[str]) -> list[str]:
    lines = [f"## accelerate=={version}'s own test suite", ""]
    missing_ci = [f for f in accelerate_suite.CI_FILES if f"tests/{f}" not in {t.partition('::')[0] for t in new_tests}]
    if missing_ci:
        lines += ["CI files (`CI_FILES` in scripts/accelerate_suite.py) the release no longer has: "
                  + ", ".join(f"`{f}`" for f in missing_ci) + ".", ""]
    lines += _added_tests(old_tests, new_tests)
    if found is None:
        return lines + ["Not run (`--no-suite`).", ""]
    real, alias = found["results"]["accelerate"], found["results"]["overdrive"]
    known = accelerate_suite.read_known()
    lines += ["| file | tests run (real) | passed under the real release | passed under the alias |", "|---|---|---|---|"]
    for name in found["files"]:
        mine = [t for t in real if accelerate_suite._file_of(t) == name]
        passed = sum(real[t] == "passed" for t in mine)
        under = sum(o == "passed" for t, o in alias.items() if accelerate_suite._file_of(t) == name)
        lines.append(f"| `{name}` | {len(mine)} | {passed} | {under} |")
    failing = sorted(t for t, o in real.items() if o == "passed" and alias.get(t) != "passed")
    lines += [f"| total | {len(real)} | {sum(o == 'passed' for o in real.values())} | "
              f"{sum(o == 'passed' for o in alias.values())} |", "",
              f"### Pass under the real release, fail under the alias ({len(failing)})", ""]
    if failing:
        lines += ["| test | under the alias | known list |", "|---|---|---|"]
        lines += [f"| `{t}` | {_code(accelerate_suite.error_of(t, found['errors']), 200)} | "
                  f"{known.get(t, '**not listed**')} |" for t in failing]
        lines.append("")
    return lines


def report(old: str, new: str, trees: dict[str, Path], wheels: dict[str, Path], surface_found: dict | None,
           suite_found: dict | None) -> str:
    """The Markdown report: what to do, then each comparison."""
    old_root, new_root = trees[old] / "src" / "accelerate", trees[new] / "src" / "accelerate"
    head = [f"# Following Accelerate {new} (from {old})", "",
            f"Written by `python scripts/follow_accelerate.py {new} --from {old}"
            + (" --no-suite" if suite_found is None else "") + f"` on {time.strftime('%d %b %Y')} (torch "
            f"{_installed('torch')}, Python {sys.version.split()[0]}, {os.cpu_count()} cores). Work from the top:", "",
            "1. Serve each new name, flag and config key below, or list it as absent with its reason "
            "(only hardware overdrive does not drive).",
            "2. Match each changed signature and default; the tests the release added show its changed "
            "behaviours (the suite section), and where two releases differ the new one wins.",
            "3. Keep each removed name working under the alias with a deprecation warning naming this release.",
            f"4. Move the followed release to {new}: `ACCELERATE_API_VERSION` in `src/overdrive/_version.py`, the "
            "`accelerate==` pin of the test extra in `pyproject.toml`, `VERSION` in `scripts/accelerate_suite.py` "
            "(then `--record`, and `--side overdrive --update-known` for the known list).",
            "5. Run this command again with `--reuse` and fix the suite's failures under the alias until each "
            "remaining one is listed in `tests/compat/accelerate_suite_known.txt` with its reason.", ""]
    body = _changes("Public API (read from the sources)", api(old_root), api(new_root), "names")
    body += _flag_sections(launch_flags(wheels[old]), launch_flags(wheels[new]))
    body += _changes("Config file keys", config_keys(old_root), config_keys(new_root), "keys")
    body += _surface_section(surface_found)
    body += _suite_section(new, suite_found, test_ids(trees[old]), test_ids(trees[new]))
    return "\n".join(head + body).rstrip() + "\n"


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def followed_release() -> str:
    """The release overdrive follows now: ``ACCELERATE_API_VERSION`` of src/overdrive/_version.py."""
    source = (ROOT / "src" / "overdrive" / "_version.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ACCELERATE_API_VERSION" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise SystemExit("src/overdrive/_version.py has no ACCELERATE_API_VERSION")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the Accelerate release to move to (e.g. 1.17.0)")
    parser.add_argument("--from", dest="old", help="the release to compare with (default: the one followed now, "
                        "ACCELERATE_API_VERSION of src/overdrive/_version.py)")
    parser.add_argument("--no-suite", action="store_true", help="leave out the test suite runs (25-55 min)")
    parser.add_argument("--reuse", action="store_true", help="take each suite file's outcomes from its last run")
    parser.add_argument("--reuse-real", action="store_true",
                        help="the same for the real release's side only (the alias side runs again)")
    parser.add_argument("--files", nargs="*", help="only these test files of the release's tests/")
    parser.add_argument("--suite-cache", type=Path, help="where the suite runs are kept (default: "
                        ".cache/accelerate_suite for the release scripts/accelerate_suite.py runs, else "
                        ".cache/follow/suite-<version>)")
    parser.add_argument("--file-timeout", type=int, default=1800, help="seconds for one test file")
    parser.add_argument("--output", type=Path, help="the report (default: docs/follow/accelerate-<version>.md)")
    args = parser.parse_args(argv)
    old, new = args.old or followed_release(), args.version
    if old == new:
        parser.error(f"--from {old} is the release to move to: give the release overdrive follows now")
    fetched = {version: download(version) for version in (old, new)}
    trees = {version: tree for version, (tree, _) in fetched.items()}
    wheels = {version: wheel for version, (_, wheel) in fetched.items()}
    found_surface = surface(trees[old] / "src" / "accelerate", trees[new] / "src" / "accelerate")
    found_suite = None
    if not args.no_suite:
        cache = args.suite_cache or (ROOT / ".cache" / "accelerate_suite" if new == accelerate_suite.VERSION
                                     else CACHE / f"suite-{new}")
        reuse = set(accelerate_suite.SIDES) if args.reuse else {"accelerate"} if args.reuse_real else set()
        found_suite = run_suite(new, wheels[new], cache.resolve(), args.files, reuse, args.file_timeout)
    output = args.output or ROOT / "docs" / "follow" / f"accelerate-{new}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report(old, new, trees, wheels, found_surface, found_suite))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
