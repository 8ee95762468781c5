"""scripts/newest.sh (the `newest` tier, not CI) installs the newest torch and every library of the test extra
without its pin, with the machine's pip constraints lifted for those installs only, then runs the type check
and the quick tier, and fails when either fails. Run in a copy of the script whose venv tools only record how
they were called."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path, types_pass: bool) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "newest.sh", root / "scripts")
    shutil.copy(ROOT / "pyproject.toml", root)
    bin_dir = root / ".venv-newest" / "bin"
    bin_dir.mkdir(parents=True)
    log = root / "calls.log"
    (bin_dir / "python").write_text(f'#!/bin/sh\ncase "$1" in -m) echo "python $*" >> {log}; exit 0;; esac\n'
                                    f'exec {sys.executable} "$@"\n')
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "pip PIP_CONSTRAINT=$PIP_CONSTRAINT $*" >> {log}\n')
    (bin_dir / "basedpyright").write_text(f'#!/bin/sh\necho "basedpyright $*" >> {log}\nexit {0 if types_pass else 1}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return root


@pytest.mark.parametrize("types_pass", [True, False])
def test_newest_installs_everything_unpinned_then_types_and_the_quick_tier(tmp_path, types_pass):
    root = _checkout(tmp_path, types_pass)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONSTRAINT": "/etc/some/constraints.txt"}
    result = subprocess.run(["bash", "scripts/newest.sh", "-x"], cwd=root, env=env, capture_output=True, text=True,
                            timeout=60)
    install, check, types, tests = (root / "calls.log").read_text().splitlines()
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    unpinned = [requirement.split("==")[0] for requirement in extra]
    assert "accelerate" in unpinned and "ray[train]" in unpinned
    assert install.split() == ["pip", "PIP_CONSTRAINT=/dev/null", "install", "--quiet", "--disable-pip-version-check",
                               "--upgrade", "--upgrade-strategy", "eager", "torch", "-e", ".", *unpinned]
    assert check.startswith("pip PIP_CONSTRAINT=/etc/some/constraints.txt check")  # lifted for the installs only
    assert types == "basedpyright --pythonpath .venv-newest/bin/python --warnings"
    assert tests == "python -m pytest -n 2 --dist loadfile -m not slow -x"  # runs even when the types fail
    assert "newest tier on: torch " in result.stdout
    assert result.returncode == (0 if types_pass else 1), result.stderr
    assert result.stdout.strip().endswith("newest tier: passed" if types_pass else "newest tier: FAILED")
