"""The house rules that a command can count (``scripts/house_counts.py``) hold over ``src/overdrive``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "house_counts.py"


def _counter():
    """scripts/house_counts.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("house_counts", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["house_counts"] = module  # the dataclass decorator looks its module up
    spec.loader.exec_module(module)
    return module


def _counts():
    return _counter().count()


def test_internal_values_are_dataclasses_and_private_torch_api_stays_in_one_module():
    counts = _counts()
    assert counts.frozen_values == [], counts.frozen_values
    assert sorted(counts.private_torch) == ["overdrive/runtime/torch_private.py"], counts.private_torch


def test_every_import_inside_a_function_says_why_and_no_function_passes_80_lines():
    counts = _counts()
    assert counts.unexplained_imports == [], "add a '# lazy: <why>' comment or move to the top: " + ", ".join(
        counts.unexplained_imports)
    assert counts.long_functions == [], counts.long_functions


def test_the_counter_sees_what_breaks_a_rule(tmp_path):
    package = tmp_path / "overdrive"
    package.mkdir()
    (package / "bad.py").write_text(
        "import torch\n\n\nclass Plan(FrozenValue):\n    pass\n\n\n"
        "def late():\n    import json\n    return torch._C, json\n\n\n"
        "def explained():\n    import csv  # lazy: an optional reader\n    return csv\n\n\n"
        "def long():\n" + "    x = 1\n" * 85 + "    return x\n")
    counts = _counter().count(package)
    assert [place.split()[-1] for place in counts.frozen_values] == ["Plan"]
    assert list(counts.private_torch) == ["overdrive/bad.py"]
    assert counts.unexplained_imports == ["overdrive/bad.py:9"]
    assert len(counts.function_imports) == 2
    assert [place.split()[1] for place in counts.long_functions] == ["long"]
