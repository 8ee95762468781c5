"""scripts/follow_accelerate.py's comparisons, on two tiny made-up ``accelerate`` trees (no network): what it
reports new, removed and changed in the API, the config keys, the launch flags and the tests."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import follow_accelerate as follow  # noqa: E402  (scripts/ is no package)

OLD = {
    "__init__.py": "from .state import State, gone\n__version__ = '1.0.0'\n",
    "state.py": """
        from dataclasses import dataclass, field
        LIMIT = 3
        def gone(x):
            pass
        def helper(a, b: int = 1, *, c=None):
            pass
        def _private():
            pass
        @dataclass
        class State:
            size: int = field(default=1, metadata={"help": "old help"})
            names: list = field(default_factory=list)
            def run(self, steps=10):
                pass
            def _inner(self):
                pass
        class Old:
            pass
        """,
    "commands/launch.py": """
        import argparse
        def launch_command_parser():
            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Resources")
            group.add_argument("--num_processes", type=int, default=None, help="How many.")
            parser.add_argument("--dynamic", action="store_true", help="Old help.")
            parser.add_argument("--backend", choices=["a", "b"], default="a")
            return parser
        """,
    "commands/config/config_args.py": """
        from dataclasses import dataclass
        @dataclass
        class ClusterConfig:
            num_processes: int = -1
            gpu_ids: str = None
        """,
    "commands/config/cluster.py": """
        def ask():
            dynamo_config = {}
            prefix = "dynamo_"
            dynamo_config[prefix + "backend"] = 1
            fsdp_config = {}
            fsdp_config["fsdp_version"] = 2
        """,
}
NEW = {
    **OLD,
    "__init__.py": "from .state import State, added\n__version__ = '1.1.0'\n",
    "state.py": """
        from dataclasses import dataclass, field
        LIMIT = 4
        def added(y=None):
            pass
        def helper(a, b: str = 2, *, c=None):
            pass
        @dataclass
        class State:
            size: int = field(default=1, metadata={"help": "new help: not part of the API"})
            names: list = field(default_factory=tuple)
            quiet: bool = False
            def run(self, steps=10):
                pass
        class Newer:
            def go(self):
                pass
        """,
    "utils/__init__.py": "",
    "commands/launch.py": """
        import argparse
        def launch_command_parser():
            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Resources")
            group.add_argument("--num_processes", "--num-processes", type=int, default=None, help="How many.")
            parser.add_argument("--dynamic", action="store_true", default=None, help="New help.")
            parser.add_argument("--quiet", action="store_true", help="Less.")
            return parser
        """,
    "commands/config/cluster.py": """
        def ask():
            dynamo_config = {}
            prefix = "dynamo_"
            dynamo_config[prefix + "backend"] = 1
            dynamo_config[prefix + "use_dynamic"] = 1
        """,
}


def _tree(folder: Path, files: dict[str, str]) -> Path:
    package = folder / "src" / "accelerate"
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(textwrap.dedent(text))
    return package


def test_api_diff_names_what_is_new_removed_and_changed(tmp_path):
    old, new = follow.api(_tree(tmp_path / "old", OLD)), follow.api(_tree(tmp_path / "new", NEW))
    assert old["accelerate.state.helper"] == "def helper(a, b=1, *, c=None)"  # annotations left out
    assert old["accelerate.state.State"] == "@dataclass class State"
    assert old["accelerate.state.State.size"] == ": int = 1"  # a field's help text is no part of the API
    assert not {"accelerate.state._private", "accelerate.state.State._inner", "accelerate.__version__"} & set(old)
    added, removed, changed = follow.diff(old, new)
    assert added == ["accelerate.added", "accelerate.state.Newer", "accelerate.state.Newer.go",
                     "accelerate.state.State.quiet", "accelerate.state.added", "accelerate.utils"]
    assert removed == ["accelerate.gone", "accelerate.state.Old", "accelerate.state.gone"]
    assert changed == [("accelerate.state.LIMIT", "= 3", "= 4"),
                       ("accelerate.state.State.names", ": list = list()", ": list = tuple()"),
                       ("accelerate.state.helper", "def helper(a, b=1, *, c=None)", "def helper(a, b=2, *, c=None)")]
    # a new class is one row with its members counted, not one row each
    assert follow._folded(added) == [("accelerate.added", 0), ("accelerate.state.Newer", 1),
                                     ("accelerate.state.State.quiet", 0), ("accelerate.state.added", 0),
                                     ("accelerate.utils", 0)]


def test_config_keys_read_the_config_classes_and_the_nested_sections(tmp_path):
    old, new = follow.config_keys(_tree(tmp_path / "old", OLD)), follow.config_keys(_tree(tmp_path / "new", NEW))
    assert old == {"ClusterConfig.num_processes": ": int = -1",
                   "ClusterConfig.gpu_ids": ": str = None",
                   "dynamo_config.dynamo_backend": "written by commands/config/cluster.py",
                   "fsdp_config.fsdp_version": "written by commands/config/cluster.py"}
    assert follow.diff(old, new) == (["dynamo_config.dynamo_use_dynamic"], ["fsdp_config.fsdp_version"], [])


def test_launch_flags_come_from_the_release_s_own_parser(tmp_path):
    old = follow.launch_flags(_tree(tmp_path / "old", OLD).parent)
    new = follow.launch_flags(_tree(tmp_path / "new", NEW).parent)
    assert old["--num_processes"] == {"spec": "Store, default=None, type=int", "help": "How many.",
                                      "group": "Resources"}
    added, removed, changed = follow.diff({k: v["spec"] for k, v in old.items()}, {k: v["spec"] for k, v in new.items()})
    assert (added, removed) == (["--quiet"], ["--backend"])
    assert changed == [("--dynamic", "StoreTrue, default=False, type=None, nargs=0",
                        "StoreTrue, default=None, type=None, nargs=0"),
                       ("--num_processes", "Store, default=None, type=int",
                        "Store, default=None, type=int, also --num-processes")]
    section = "\n".join(follow._flag_sections(old, new))
    assert "Help text changed: `--dynamic`." in section and "| `--quiet` |" in section


def test_test_ids_list_the_tests_as_written(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(textwrap.dedent("""
        def test_one():
            pass
        def helper():
            pass
        class Tester:
            def test_two(self):
                pass
            def setUp(self):
                pass
        """))
    assert follow.test_ids(tmp_path) == {"tests/test_a.py::test_one", "tests/test_a.py::Tester::test_two"}
