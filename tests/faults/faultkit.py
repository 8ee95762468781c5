"""Helpers of the fault-injection suite: the CLI's environment and runner (tests/support/cli.py), with
temporary files kept under the test's own folder, and the folder of the suite's scripts."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import clean_env as _clean_env
from tests.support.cli import overdrive  # noqa: F401  (re-exported)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """test_cli's clean environment, with ``TMPDIR`` in ``tmp_path`` too: what a faulty run leaves behind
    stays in the test's folder."""
    return _clean_env(tmp_path, **{"TMPDIR": str(tmp_path), **extra})
