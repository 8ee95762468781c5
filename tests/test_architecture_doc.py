"""ARCHITECTURE.md stays true to the code: every file or folder it names exists, its layer table names each
module of tests/test_layering.py's ``LAYERS``, and every registry line it quotes
(``"name": "overdrive.module:Attribute"``) stands in the source and names something importable."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "src" / "overdrive"


def _expand(path: str) -> list[str]:
    """``utils/{misc,random}.py`` -> ``utils/misc.py``, ``utils/random.py``."""
    match = re.search(r"\{([^}]*)\}", path)
    if match is None:
        return [path]
    return [p for part in match[1].split(",") for p in _expand(path[:match.start()] + part + path[match.end():])]


def named_paths() -> list[str]:
    """The paths in backticks: with a slash, or a file name with a suffix (``ARCHITECTURE.md``)."""
    found = []
    for token in re.findall(r"`([^`\s]+)`", DOC):
        token = token.rstrip(",.:;")
        if token.startswith("../") or "<" in token or "://" in token:
            continue  # outside the repository, or a pattern (tracking/<name>.py)
        if "/" in token or re.fullmatch(r"[\w.]+\.(py|md|toml|json|sh)", token):
            found += _expand(token)
    return sorted(set(found))


def _exists(path: str) -> bool:
    """Relative to the repository, the package or tests/; a bare name (``torchrun.py`` in the launchers'
    row, ``pipeline/``) anywhere in the package."""
    if any((base / path).exists() for base in (ROOT, PACKAGE, ROOT / "tests")):
        return True
    name = path.rstrip("/")
    return "/" not in name and any(p.name == name for p in PACKAGE.rglob(name))


def test_every_path_the_architecture_page_names_exists() -> None:
    paths = named_paths()
    assert len(paths) > 20  # the check reads the page at all
    missing = [p for p in paths if not _exists(p)]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_quoted_registry_lines_stand_in_the_source_and_import() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    lines = re.findall(r'^\s*("[\w-]+": "overdrive\.[\w.]+(?::\w+)?",)', DOC, flags=re.M)
    assert lines, "ARCHITECTURE.md quotes no registry line"
    for line in lines:
        assert line in source, f"ARCHITECTURE.md quotes {line}, which no registry in src/overdrive holds"
        target = line.split('": "', 1)[1].rstrip('",')
        module, _, attribute = target.partition(":")
        imported = importlib.import_module(module)
        assert not attribute or hasattr(imported, attribute), f"{target} does not exist"


def test_the_layer_table_names_every_layered_module() -> None:
    from tests.test_layering import LAYERS

    named = set(named_paths())
    missing = []
    for prefixes in LAYERS[:-1]:  # the compat layer's row ends in "...": its modules only re-export
        for prefix in prefixes:
            path = prefix.removeprefix("overdrive.").replace(".", "/")
            if f"{path}.py" not in named and f"{path}/" not in named:
                missing.append(prefix)
    assert not missing, f"ARCHITECTURE.md's layer table does not name {missing} (tests/test_layering.py LAYERS)"


# -- the "How to add ..." recipes, each done once: one new file (here a module in tmp_path) and nothing else

def _import_file(tmp_path: Path, name: str, source: str):  # noqa: ANN202 - a module
    """Write ``source`` as the module ``name`` in ``tmp_path`` and import it (as a user's own file would be)."""
    import sys
    import textwrap

    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_recipe_a_tracker_is_one_module(tmp_path: Path) -> None:
    """A ``GeneralTracker`` subclass and its ``register_tracker`` line, in the user's own module: ``log_with``
    then starts it by name, and it receives the configuration, the values and the end of training."""
    from overdrive import Accelerator
    from overdrive.tracking.base import unregister_tracker

    module = _import_file(tmp_path, "recipe_tracker", '''
        from overdrive.tracking import GeneralTracker, register_tracker

        EVENTS = []

        class ListTracker(GeneralTracker):
            """Records what it is given."""

            name = "recipe_list"

            def __init__(self, run_name):
                self.run_name = run_name

            def start(self):
                EVENTS.append(("start", self.run_name))

            def store_init_configuration(self, values):
                EVENTS.append(("config", values))

            def log(self, values, step=None, **kwargs):
                EVENTS.append(("log", values, step))

            def finish(self):
                EVENTS.append(("finish",))

        register_tracker("recipe_list", ListTracker)
    ''')
    try:
        accelerator = Accelerator(log_with="recipe_list")
        accelerator.init_trackers("recipe_run", config={"lr": 0.1})
        accelerator.log({"loss": 1.5}, step=3)
        assert isinstance(accelerator.get_tracker("recipe_list", unwrap=True), module.ListTracker)
        accelerator.end_training()
        assert module.EVENTS == [("start", "recipe_run"), ("config", {"lr": 0.1}), ("log", {"loss": 1.5}, 3),
                                 ("finish",)]
    finally:
        unregister_tracker("recipe_list")
