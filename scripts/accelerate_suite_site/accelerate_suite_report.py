"""pytest plugin of ``accelerate_suite.py``: writes ``{node id: passed|failed|skipped}`` to the JSON file named
by ``ACCELERATE_SUITE_REPORT`` when the session ends. A test passes when its setup, call, every subtest and
its teardown passed. With ``ACCELERATE_SUITE_ERRORS`` set, also writes ``{node id: the error's last line}``
there for every failed test and every file that failed to import."""

from __future__ import annotations

import json
import os

_outcomes: dict[str, str] = {}
_errors: dict[str, str] = {}


def _last_line(report) -> str:
    """The traceback's last line (``AssertionError: ...``, its first line only), else the report's last line."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = [line.strip() for line in (getattr(crash, "message", None) or "").splitlines() if line.strip()]
    lines = message[:1] or [line.strip() for line in str(report.longrepr).splitlines() if line.strip()][-1:]
    return lines[0].removeprefix("E ").strip()[:300] if lines else "(no message)"


def pytest_runtest_logreport(report) -> None:
    """Fold one phase's report into the test's outcome (a failure anywhere sticks)."""
    node = report.nodeid
    if _outcomes.get(node) == "failed":
        return
    if report.failed:
        _outcomes[node] = "failed"
        _errors[node] = f"[{report.when}] {_last_line(report)}"
    elif report.skipped and report.when in ("setup", "call"):
        _outcomes[node] = "skipped"
    elif report.passed and report.when == "call" and node not in _outcomes:
        _outcomes[node] = "passed"


def pytest_collectreport(report) -> None:
    """A file that fails to import counts as failed (its tests are then missing from the report)."""
    if report.failed:
        _outcomes[report.nodeid] = "failed"
        _errors[report.nodeid] = f"[collect] {_last_line(report)}"


def pytest_sessionfinish(session, exitstatus) -> None:
    """Write the outcomes (and the errors)."""
    for variable, found in (("ACCELERATE_SUITE_REPORT", _outcomes), ("ACCELERATE_SUITE_ERRORS", _errors)):
        path = os.environ.get(variable)
        if path:
            with open(path, "w") as handle:
                json.dump(found, handle, indent=0, sort_keys=True)
