"""The package's layers, folder by folder: every folder (and module) at the package root sits on one level,
no module imports from a level above its own or from another entry on its level, each entry sits just above
the highest entry it imports (the table is the real graph, not a ladder), and there is no import cycle, neither
between modules nor between folders. Imports inside functions count, and so does a string that names a module
in another folder (``importlib.import_module("overdrive.x")``, ``sys.modules.get(...)``, a registry's
``"overdrive.x.y:Attr"``, a lazy-export table): only ``if TYPE_CHECKING:`` blocks are left out (they never
run). There is no allow-list.

To add a module: a file inside a folder takes the folder's level; a new folder or root module needs one
entry below. ARCHITECTURE.md explains the levels.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Lowest first: the folders and root modules of ``src/overdrive`` (folders only, never a module inside one), by
#: level: an entry imports only from the levels below its own (never a sibling on its level), and from the level
#: just below at least once, so the table is the real graph (``python tests/test_layering.py`` prints it).
LAYERS: list[tuple[str, ...]] = [
    # 0 the version and the lazy-export helper every package's __init__ uses
    ("overdrive._version", "overdrive._lazy"),
    # 1 siblings: Accelerate's public configuration values (plugins, kwargs handlers, enums); where code runs
    #   (rank and world size: runtime/group.py, the one source; device, process group, mesh)
    ("overdrive.config", "overdrive.runtime"),
    # 2 helpers over torch and the runtime: collectives over nested structures, logging, seeds, memory, the
    #   environment and availability helpers
    ("overdrive.helpers",),
    # 3 siblings: the launchers (and the launch-settings schema), the precision policy, the trackers
    ("overdrive.launchers", "overdrive.precision", "overdrive.tracking"),
    # 4 the model transforms (FSDP2's mixed precision and fp8 come from precision/)
    ("overdrive.transforms",),
    # 5 the resolver: arguments + launch config + environment -> frozen plans
    ("overdrive.resolve",),
    # 6 the objects one training loop runs through: process and gradient state, the accumulation window, the
    #   prepared-objects registry, the optimizer and scheduler wrappers
    ("overdrive.training",),
    # 7 siblings: prepared data loaders, the strategies, big-model inference
    ("overdrive.data", "overdrive.strategies", "overdrive.big_model"),
    # 8 checkpoints (consolidated export reads big_model's offloaded weights)
    ("overdrive.checkpoint",),
    # 9 the facade
    ("overdrive.accelerator",),
    # 10 the command line
    ("overdrive.cli",),
    # 11 compat: the alias, the one table of Accelerate's paths (served by compat/paths.py: no thin files),
    #    Accelerate-only helpers and refusals
    ("overdrive.compat",),
    # 12 the public surface: the lazy root package
    ("overdrive",),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted((SRC / "overdrive").rglob("*.py"))}


def top_level(module: str) -> str:
    """The root entry (folder or root module) ``module`` belongs to: ``overdrive.data.loader`` ->
    ``overdrive.data``; the root package is ``overdrive``."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s root entry (None: no entry)."""
    return next((index for index, entries in enumerate(LAYERS) if top_level(module) in entries), None)


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom | ast.Constant]:
    """The imports and the string literals of ``tree``, outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom | ast.Constant] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(getattr(node, "orelse", []))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Constant) and isinstance(node.value, str)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


#: a string that names a module (``"overdrive.compat.worker"``, ``"overdrive.tracking.csv:CSVTracker"``): what
#: ``importlib.import_module``, ``sys.modules`` lookups and the lazy-export tables take
MODULE_NAME = re.compile(r"(overdrive(?:\.\w+)+)(?::[\w.]+)?")


#: the package that serves Accelerate's dotted paths under ``overdrive`` (``compat/paths.py``): a string naming
#: one of them depends on it
SERVED_BY = "overdrive.compat"


def named_module(text: str) -> str | None:
    """The module a string literal names, or None: a dotted ``overdrive.`` path, optionally ``:Attribute``."""
    match = MODULE_NAME.fullmatch(text)
    return match[1] if match else None


def imports_of(module: str) -> set[tuple[str, int]]:
    """The overdrive modules ``module`` imports or names in a string (as ``(target, line)``), resolved to
    existing modules."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[tuple[str, int]] = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant):
            names = [name] if (name := named_module(node.value)) else []
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # "from pkg import sub" imports the submodule pkg.sub when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            named = name
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if isinstance(node, ast.Constant) and name == "overdrive" and named != "overdrive":
                name = SERVED_BY  # an Accelerate path that no file holds (``"overdrive.big_modeling"``)
            # a string inside its own folder is a registry's lazy entry (``tracking/base.py``'s built-in trackers):
            # it orders nothing at import; across folders it is a dependency like an import
            inside = isinstance(node, ast.Constant) and top_level(name) == top_level(module)
            if name.startswith("overdrive") and name != module and not inside:
                targets.add((name, node.lineno))
    return targets


GRAPH = {module: imports_of(module) for module in MODULES}


#: the root entries (folders and root modules) and the imports between them, each with the lines behind it
ROOT_ENTRIES = sorted({top_level(module) for module in MODULES})
FOLDER_GRAPH: dict[str, set[tuple[str, int]]] = {entry: set() for entry in ROOT_ENTRIES}
for _module, _targets in GRAPH.items():
    for _target, _line in _targets:
        if top_level(_target) != top_level(_module):
            FOLDER_GRAPH[top_level(_module)].add((top_level(_target), _line))


def upward_imports() -> list[str]:
    """Every import from a module to one in a higher layer."""
    upward = []
    for module, targets in GRAPH.items():
        for target, line in sorted(targets):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high > low:
                upward.append(f"{module}:{line} imports {target} (layer {high} {LAYERS[high][0]} is above "
                              f"layer {low} {LAYERS[low][0]})")
    return upward


def test_every_module_has_a_layer() -> None:
    missing = sorted({top_level(m) for m in MODULES if layer_of(m) is None})
    assert not missing, f"root entries without a layer: {missing}; add them to LAYERS in {__file__}"


def test_the_layers_list_root_entries_that_exist() -> None:
    """The table names folders and root modules only, each once, and each exists."""
    listed = [entry for entries in LAYERS for entry in entries]
    assert len(listed) == len(set(listed))
    assert not [e for e in listed if top_level(e) != e or e not in ROOT_ENTRIES]


def test_no_upward_imports() -> None:
    upward = upward_imports()
    assert not upward, "imports that run upward:\n  " + "\n  ".join(upward)


def test_entries_on_one_level_are_siblings() -> None:
    """Two entries on one level never import each other: a level holds independent folders."""
    found = [f"{m}:{line} imports {t} (both on level {layer_of(m)})" for m, targets in GRAPH.items()
             for t, line in sorted(targets)
             if top_level(m) != top_level(t) and layer_of(m) is not None and layer_of(m) == layer_of(t)]
    assert not found, "imports between siblings (move the importer a level up):\n  " + "\n  ".join(found)


def lowest_levels() -> dict[str, int]:
    """Each root entry's level in the real graph: 0 without imports, else one above the highest it imports."""
    levels: dict[str, int] = {}

    def level(entry: str) -> int:
        if entry not in levels:
            levels[entry] = 0  # a cycle (reported by its own test) ends here
            levels[entry] = max((level(t) + 1 for t, _ in FOLDER_GRAPH[entry]), default=0)
        return levels[entry]

    for entry in FOLDER_GRAPH:
        level(entry)
    return levels


def test_each_entry_sits_on_its_lowest_level() -> None:
    """The table is the graph, not a ladder: every entry sits just above the highest entry it imports."""
    wrong = [f"{entry} is on level {layer_of(entry)}, its imports put it on level {level}"
             for entry, level in sorted(lowest_levels().items()) if layer_of(entry) != level]
    assert not wrong, "move these entries in LAYERS (and ARCHITECTURE.md's table):\n  " + "\n  ".join(wrong)


def _cycles(graph: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan), each a cycle or a knot of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def _is_package_init(module: str, target: str) -> bool:
    """A package importing its own submodules, and they importing a sibling through the package: the
    package's ``__init__`` only gathers names, so this is not a cycle between layers of code."""
    return MODULES[target].name == "__init__.py" and module.startswith(target + ".")


def test_no_import_cycles() -> None:
    cycles = []
    for group in _cycles(GRAPH):
        members = set(group)
        edges = [f"{m}:{line} -> {t}" for m in group for t, line in sorted(GRAPH[m])
                 if t in members and not _is_package_init(m, t)]
        cycles.append(", ".join(group) + "\n      " + "\n      ".join(edges))
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_no_cycles_between_folders() -> None:
    """Folder A imports folder B and B imports A (through any modules): the two cannot be read apart."""
    cycles = []
    for group in _cycles(FOLDER_GRAPH):
        members = set(group)
        edges = [f"{m}:{line} -> {t}" for m in GRAPH for t, line in sorted(GRAPH[m])
                 if top_level(m) in members and top_level(t) in members and top_level(t) != top_level(m)]
        cycles.append(", ".join(group) + "\n      " + "\n      ".join(edges))
    assert not cycles, "cycles between folders:\n  " + "\n  ".join(cycles)


def counts() -> dict[str, int]:
    """The figures issue 23 tracks: root entries, folder pairs with an upward import, folder cycles."""
    upward_pairs = {(top_level(m), top_level(t)) for m, targets in GRAPH.items() for t, _ in targets
                    if top_level(m) != top_level(t) and (layer_of(t) or 0) > (layer_of(m) or 0)}
    return {"root entries": len(list((SRC / "overdrive").glob("[!_]*"))) + len(list((SRC / "overdrive").glob("_*.py"))),
            "upward imports (module lines)": len(upward_imports()),
            "upward imports (folder pairs)": len(upward_pairs),
            "folder cycles": len(_cycles(FOLDER_GRAPH))}


def test_importing_data_does_not_load_the_resolver() -> None:
    """The data loaders read the process's state (``GradientState``, ``PartialState``), never the resolver:
    ``PartialState`` loads ``resolve.process`` only when it first resolves the process, not at import."""
    import subprocess
    import sys

    code = ("import sys, overdrive.data; "
            "print(sorted(m for m in sys.modules if m.startswith(('overdrive.resolve', 'overdrive.strategies', 'overdrive.transforms', 'overdrive.tracking', "
            "'overdrive.accelerator', 'overdrive.checkpoint'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


#: modules outside ``runtime/`` allowed to ask torch.distributed for a rank or world size directly, with why
RANK_CALLS_ALLOWED: dict[str, str] = {}


def _asks_torch_for_rank(node: ast.AST) -> bool:
    """``dist.get_rank(...)`` / ``torch.distributed.get_world_size(...)`` (any alias of torch.distributed), or
    the bare function imported from it."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("get_rank", "get_world_size"):
        receiver = ast.unparse(func.value)
        return receiver in ("dist", "torch.distributed", "_dist", "torch_dist")
    return isinstance(func, ast.Name) and func.id in ("get_rank", "get_world_size")


def test_rank_and_world_size_come_from_runtime_group() -> None:
    """``runtime/group.py`` is the one source of rank and world size (it falls back to the launcher's
    variables before the process group exists); no other module asks torch.distributed itself."""
    found = []
    for module, path in MODULES.items():
        if module.startswith("overdrive.runtime") or module in RANK_CALLS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _asks_torch_for_rank(node):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert not found, ("call overdrive.runtime.group.rank() / world_size() instead:\n  " + "\n  ".join(found))


def test_the_rank_check_sees_each_spelling() -> None:
    calls = ["dist.get_rank()", "torch.distributed.get_world_size(group)", "get_rank()"]
    assert all(_asks_torch_for_rank(ast.parse(code).body[0].value) for code in calls)  # type: ignore[attr-defined]
    assert not _asks_torch_for_rank(ast.parse("mesh.get_rank()").body[0].value)  # type: ignore[attr-defined]


if __name__ == "__main__":  # python tests/test_layering.py: the counts and the levels of the real graph
    for key, value in counts().items():
        print(f"{key}: {value}")
    by_level: dict[int, list[str]] = {}
    for _entry, _level in lowest_levels().items():
        by_level.setdefault(_level, []).append(_entry)
    for _level, _entries in sorted(by_level.items()):
        print(f"level {_level}: {', '.join(sorted(_entries))}")
