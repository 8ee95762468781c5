"""Helpers of the fault-injection suite: the CLI's environment and runner (tests/cli/test_cli.py), with
temporary files kept under the test's own folder, and the folder of the suite's scripts."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
for _folder in (TESTS, TESTS / "cli"):  # tests/distributed.py, tests/cli/test_cli.py
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from test_cli import clean_env as _clean_env  # noqa: E402
from test_cli import overdrive  # noqa: E402,F401  (re-exported)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """test_cli's clean environment, with ``TMPDIR`` in ``tmp_path`` too: what a faulty run leaves behind
    stays in the test's folder."""
    return _clean_env(tmp_path, **{"TMPDIR": str(tmp_path), **extra})
