"""scripts/demo.sh and scripts/test.sh set up .venv only when it is missing or out of date (the demo used to
reinstall on every run: 2:14 for 3 s of training), and ``--quick`` selects everything but the slow tests. Run in
a copy of the scripts whose .venv tools only record how they were called."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    """A checkout with the real scripts and pyproject.toml, and a .venv whose python runs this interpreter on
    the checkout's own (empty) overdrive package and whose other tools append their arguments to calls.log."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("*.py"))
    shutil.copy(ROOT / "pyproject.toml", root)
    (root / "src" / "overdrive").mkdir(parents=True)
    (root / "src" / "overdrive" / "__init__.py").write_text("")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\ncase "$1" in -m) echo "python $*" >> {root}/calls.log; exit 0;; esac\n'
                                    f'PYTHONPATH={root}/src exec {sys.executable} "$@"\n')
    for tool in ("pip", "overdrive", "ruff", "basedpyright"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {root}/calls.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return root


def _run(root: Path, script: str, *args: str) -> list[str]:
    log = root / "calls.log"
    log.unlink(missing_ok=True)
    result = subprocess.run(["bash", f"scripts/{script}", *args], cwd=root, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_demo_installs_once_and_again_only_when_pyproject_changes(tmp_path):
    root = _checkout(tmp_path)
    first = _run(root, "demo.sh")
    assert [call.split()[0] for call in first] == ["pip", "overdrive"] and first[0].endswith('-e .[examples]')
    assert _run(root, "demo.sh", "--epochs", "1") == ["overdrive launch --num_processes 2 examples/digits.py --epochs 1"]
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "\n# changed\n")
    assert [call.split()[0] for call in _run(root, "demo.sh")] == ["pip", "overdrive"]


def test_test_script_installs_once_and_quick_skips_the_slow_tests(tmp_path):
    root = _checkout(tmp_path)
    first = _run(root, "test.sh", "-x")
    assert first[0].startswith("pip install") and first[0].endswith("-e .[test]")
    assert first[1:] == ["ruff check src tests bench examples scripts",
                         "basedpyright --pythonpath .venv/bin/python --warnings",
                         "python -m pytest -n 2 --dist loadfile -x"]
    assert _run(root, "test.sh", "--quick", "-q")[-1] == "python -m pytest -n 2 --dist loadfile -m not slow -q"
    assert "pip" not in " ".join(_run(root, "demo.sh"))  # the test extra includes the demo's
