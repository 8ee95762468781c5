"""The fault-injection suite's slow mode: tests marked ``slow`` here (e.g. 20 random kills of a save) run
only when asked for with ``-m slow`` (or any ``-m`` expression naming ``slow``), never by default."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="the fault suite's slow mode: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None and "faults" in item.path.parts:
            item.add_marker(skip)
