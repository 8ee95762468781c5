"""The ``cluster`` fixture: two machines as network namespaces (``netns.Cluster``), removed after the test
whatever happens; the test is skipped, with the reason, where namespaces cannot be made (not root)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.machines.netns import Cluster, unavailable


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with Cluster(2) as made:
        yield made
