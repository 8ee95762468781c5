"""Every use of Accelerate that installed libraries make, found by reading their source (``ast``, nothing of
theirs is imported), and a check of each use against a running ``accelerate`` (the real one, or overdrive
through ``install_as_accelerate()``).

A use is a chain of steps from a module import: ``import accelerate.utils`` is ``[import accelerate.utils]``;
``from accelerate.state import PartialState`` then ``PartialState._shared_state`` is ``[import accelerate.state,
.PartialState, ._shared_state]``; ``self.accelerator = Accelerator(...)`` then ``self.accelerator.state.num_processes``
is ``[import accelerate, .Accelerator, (), .state, .num_processes]`` (``()``: an instance, built with no
arguments). Found statically:

- ``import accelerate[.x] [as y]`` and ``from accelerate[.x] import a [as b]``, anywhere (functions, ``try``);
- attribute chains on names bound to those (``accelerate.utils.X``, ``DistributedType.MULTI_GPU``), on calls of
  them (``AcceleratorState().distributed_type``) and on names or ``self.<attr>`` assigned from them, in the same
  file;
- attribute chains on ``accelerator`` / ``<anything>.accelerator`` (the libraries' name for their Accelerator,
  often bound in a parent class), taken as an ``Accelerator`` instance;
- ``getattr(<one of those>, "name")`` without a default.

Walking a chain (``--walk real|alias``, the chains as JSON on stdin) reports how many steps resolve and why it
stopped: ``missing`` (an import or attribute that is not there), ``none`` (the value is ``None``: nothing more
is known statically), ``uncallable`` (a call of something that is not a class, or a class that cannot be built
without arguments), ``done``. Attributes that exist but raise when read (properties needing a set-up) count as
present, and the walk stops there.

``python tests/scripts/accelerate_usage_scan.py [packages...]`` prints the table of chains that resolve under the
real Accelerate and not under the alias.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

LIBRARIES = ("transformers", "peft", "trl", "diffusers", "sentence_transformers", "setfit", "lm_eval")
#: one step of a chain: ["import", "accelerate.x"], ["attr", "name"] or ["call"]
Step = list[str]
ACCELERATOR = [["import", "accelerate"], ["attr", "Accelerator"], ["call"]]


def package_files(package: str) -> list[Path]:
    """The ``.py`` files of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(p for root in spec.submodule_search_locations for p in Path(root).rglob("*.py"))


class _FileScan:
    """The chains of one parsed file."""

    def __init__(self, tree: ast.AST) -> None:
        self.tree = tree
        self.bindings: dict[str, list[Step]] = {}  # "name" or "self.attr" -> the chain it holds
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def imports(self) -> Iterator[tuple[list[Step], int]]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != "accelerate":
                        continue
                    yield [["import", alias.name]], node.lineno
                    if alias.asname:
                        self.bindings[alias.asname] = [["import", alias.name]]
                    else:
                        self.bindings["accelerate"] = [["import", "accelerate"]]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == "accelerate":
                for alias in node.names:
                    chain = [["import", node.module], ["attr", alias.name]]
                    yield chain, node.lineno
                    self.bindings[alias.asname or alias.name] = chain

    def resolve(self, node: ast.AST) -> list[Step] | None:
        """The chain an expression denotes, or None when it is not (statically) an accelerate object."""
        if isinstance(node, ast.Name):
            if node.id in self.bindings:
                return self.bindings[node.id]
            return list(ACCELERATOR) if node.id == "accelerator" else None
        if isinstance(node, ast.Attribute):
            key = _self_key(node)
            if key is not None and key in self.bindings:
                return self.bindings[key]
            base = self.resolve(node.value)
            if base is not None:
                return [*base, ["attr", node.attr]]
            if node.attr == "accelerator" and not _rooted_at(node, "torch"):
                return list(ACCELERATOR)
            return None
        if isinstance(node, ast.Call):
            if _is_getattr(node):
                base = self.resolve(node.args[0])
                name = node.args[1]
                if base is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
                    return [*base, ["attr", name.value]]
                return None
            base = self.resolve(node.func)
            # a class (by its name: ``PartialState()``) gives an instance; a method's result is not followed
            if base is not None and base[-1][0] == "attr" and base[-1][1][:1].isupper():
                return [*base, ["call"]]
        return None

    def bind_assignments(self) -> None:
        """``x = <accelerate object>`` and ``self.x = <...>`` bind ``x`` (twice over: a binding may use another)."""
        for _ in range(2):
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    chain = self.resolve(node.value)
                    if chain is None:
                        continue
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        key = target.id if isinstance(target, ast.Name) else _self_key(target)
                        if key is not None:
                            self.bindings[key] = chain

    def uses(self) -> Iterator[tuple[list[Step], int]]:
        """The longest chain at each attribute access (read, or written: ``accelerator.even_batches = False``
        must set Accelerate's property, not a new attribute) or ``getattr``."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                parent = self.parents.get(node)
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    continue  # the outer attribute carries the longer chain
                chain = self.resolve(node)
            elif isinstance(node, ast.Call) and _is_getattr(node):
                chain = self.resolve(node)
            else:
                continue
            if chain is not None and len(chain) > 1:
                yield chain, node.lineno
                for typed in _typed(chain):
                    yield typed, node.lineno


#: attributes that are None (or absent) on a default Accelerator, and the class of their value when set: a chain
#: through one is checked again from a default instance of that class
TYPED = {"parallelism_config": "ParallelismConfig", "deepspeed_plugin": "DeepSpeedPlugin",
         "fsdp_plugin": "FullyShardedDataParallelPlugin", "torch_tp_plugin": "TorchTensorParallelPlugin",
         "megatron_lm_plugin": "MegatronLMPlugin", "dynamo_plugin": "TorchDynamoPlugin"}


def _typed(chain: list[Step]) -> Iterator[list[Step]]:
    for i, step in enumerate(chain[1:], 1):
        if step[0] == "attr" and step[1] in TYPED and chain[0] != ["import", "accelerate.utils"] and i + 1 < len(chain):
            yield [["import", "accelerate.utils"], ["attr", TYPED[step[1]]], ["call"], *chain[i + 1:]]


def _self_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _rooted_at(node: ast.AST, name: str) -> bool:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id == name


def _is_getattr(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 2 and not node.keywords


def scan_source(text: str) -> list[tuple[list[Step], int]]:
    """Every accelerate chain one file's source uses, with its line."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    scan = _FileScan(tree)
    found = list(scan.imports())
    scan.bind_assignments()
    return found + list(scan.uses())


_MAY_USE = re.compile(r"^\s*(from\s+accelerate[\s.]|import\s+accelerate\b)|accelerator\.", re.MULTILINE)


def scan(packages: Iterable[str]) -> dict[str, list[str]]:
    """chain (as JSON text) -> the places that use it (``package/file.py:line``), over the given packages."""
    chains: dict[str, list[str]] = {}
    for package in packages:
        for path in package_files(package):
            text = path.read_text(encoding="utf-8", errors="replace")
            if not _MAY_USE.search(text):
                continue  # parsing is the cost: skip files that neither import accelerate nor use an accelerator
            where = path.as_posix().split("site-packages/")[-1]
            for chain, line in scan_source(text):
                chains.setdefault(json.dumps(chain), []).append(f"{where}:{line}")
    return chains


# --- walking (runs in a child process, with the real accelerate or the alias) ------------------------------

_MISSING = object()


def _attribute(value: object, name: str, path: str | None) -> tuple[object, str | None]:
    """``value.name`` (or the submodule ``path.name``); _MISSING when absent; raises when reading it raises."""
    if inspect.ismodule(value) and path is not None:
        try:
            return getattr(value, name), None if not inspect.ismodule(getattr(value, name)) else f"{path}.{name}"
        except AttributeError:
            try:
                return importlib.import_module(f"{path}.{name}"), f"{path}.{name}"
            except ModuleNotFoundError:
                return _MISSING, None
    try:
        return getattr(value, name), None
    except AttributeError:
        return _MISSING, None


def walk(chain: list[Step], instances: dict[int, object]) -> tuple[int, str]:
    """How many steps of ``chain`` resolve, and why the walk stopped."""
    value: object = None
    path: str | None = None
    for done, step in enumerate(chain):
        try:
            if step[0] == "import":
                value, path = importlib.import_module(step[1]), step[1]
                continue
            if step[0] == "call":
                if not isinstance(value, type):
                    return done, "uncallable"
                if id(value) not in instances:
                    instances[id(value)] = value()
                value, path = instances[id(value)], None
                continue
            value, path = _attribute(value, step[1], path)
        except ImportError:
            return done, "missing"
        except Exception:  # noqa: BLE001 - present, but reading it needs a set-up: stop here
            return done + 1, "raised" if step[0] != "call" else "uncallable"
        if value is _MISSING:
            return done, "missing"
        if value is None:
            return done + 1, "none"
    return len(chain), "done"


def walk_all(chains: list[list[Step]]) -> list[tuple[int, str]]:
    """Walk every chain in this process (instances built once each and shared)."""
    instances: dict[int, object] = {}
    return [walk(chain, instances) for chain in chains]


def walk_in_child(chains: list[list[Step]], engine: str, src: str | None = None, timeout: float = 300) -> list:
    """Walk the chains in a fresh interpreter, on the real Accelerate (``engine="real"``) or the alias."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    proc = subprocess.run([sys.executable, __file__, "--walk", engine], input=json.dumps(chains), text=True,
                          capture_output=True, timeout=timeout, env=env, cwd=os.environ.get("TMPDIR", "/tmp"))
    if proc.returncode != 0:
        raise RuntimeError(f"walking on {engine} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(chains: dict[str, list[str]], src: str | None = None) -> dict[str, object]:
    """Walk every chain on both; a chain is a gap when the alias resolves fewer steps than the real package."""
    keys = sorted(chains)
    decoded = [json.loads(k) for k in keys]
    real = walk_in_child(decoded, "real", src)
    ours = walk_in_child(decoded, "alias", src)
    gaps, absent_in_real = {}, []
    for key, chain, (real_done, real_why), (our_done, our_why) in zip(keys, decoded, real, ours):
        if real_why == "missing":  # the real Accelerate lacks a name on the way too: not required
            absent_in_real.append(key)
        if our_done < real_done:
            gaps[_show(chain[:our_done + 1])] = {"chain": _show(chain), "real": [real_done, real_why],
                                                 "ours": [our_done, our_why], "used_at": chains[key][:3]}
    steps = sum(min(done, len(c)) for c, (done, _) in zip(decoded, real))
    return {"chains": len(keys), "steps_checked": steps, "absent_in_real": absent_in_real, "gaps": gaps}


def _show(chain: list[Step]) -> str:
    text = ""
    for step in chain:
        text += step[1] if step[0] == "import" else "()" if step[0] == "call" else f".{step[1]}"
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--walk"]:
        if argv[1] == "alias":
            import overdrive

            overdrive.install_as_accelerate()
        print(json.dumps(walk_all(json.load(sys.stdin))))
        return 0
    packages = argv or [p for p in LIBRARIES if importlib.util.find_spec(p) is not None]
    chains = scan(packages)
    result = compare(chains, str(Path(__file__).resolve().parents[2] / "src"))
    print(f"{result['chains']} chains in {', '.join(packages)}; {result['steps_checked']} steps resolve on the "
          f"real Accelerate; {len(result['absent_in_real'])} reach a name it lacks too (not required)")
    for name, gap in sorted(result["gaps"].items()):  # type: ignore[union-attr]
        print(f"  {name}: real {gap['real']}, ours {gap['ours']}  ({gap['chain']}; {', '.join(gap['used_at'])})")
    return 1 if result["gaps"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
