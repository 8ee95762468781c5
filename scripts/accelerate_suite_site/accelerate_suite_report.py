"""pytest plugin of ``accelerate_suite.py``: writes ``{node id: passed|failed|skipped}`` to the JSON file named
by ``ACCELERATE_SUITE_REPORT`` when the session ends. A test passes when its setup, call, every subtest and
its teardown passed."""

from __future__ import annotations

import json
import os

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report) -> None:
    """Fold one phase's report into the test's outcome (a failure anywhere sticks)."""
    node = report.nodeid
    if _outcomes.get(node) == "failed":
        return
    if report.failed:
        _outcomes[node] = "failed"
    elif report.skipped and report.when in ("setup", "call"):
        _outcomes[node] = "skipped"
    elif report.passed and report.when == "call" and node not in _outcomes:
        _outcomes[node] = "passed"


def pytest_collectreport(report) -> None:
    """A file that fails to import counts as failed (its tests are then missing from the report)."""
    if report.failed:
        _outcomes[report.nodeid] = "failed"


def pytest_sessionfinish(session, exitstatus) -> None:
    """Write the outcomes."""
    path = os.environ.get("ACCELERATE_SUITE_REPORT")
    if path:
        with open(path, "w") as handle:
            json.dump(_outcomes, handle, indent=0, sort_keys=True)
