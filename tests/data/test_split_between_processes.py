"""``split_between_processes`` on 2 gloo processes: each process gets its contiguous share, a ``datasets.Dataset``
stays a Dataset (as in Accelerate: ``select`` of its rows, not a slice, which is a dict of columns), and the
padded shares gathered in order give back the input."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from tests.support.distributed import run_distributed

HAS_DATASETS = importlib.util.find_spec("datasets") is not None


def _shares() -> dict[str, Any]:
    from overdrive import PartialState
    from overdrive.utils import gather_object

    state = PartialState()
    out: dict[str, Any] = {}
    with state.split_between_processes([0, 1, 2]) as share:
        out["list"] = share
    with state.split_between_processes([0, 1, 2], apply_padding=True) as share:
        out["list_padded"] = gather_object(share)
    with state.split_between_processes(torch.arange(5)) as share:
        out["tensor"] = share.tolist()
    with state.split_between_processes({"a": [1, 2, 3, 4], "b": ["w", "x", "y", "z"]}) as share:
        out["dict"] = share
    if HAS_DATASETS:
        import datasets

        odd = datasets.Dataset.from_list([{"k": v} for v in range(3)])
        with state.split_between_processes(odd) as share:
            out["dataset_type"] = type(share).__name__
            out["dataset"] = share["k"]
        with state.split_between_processes(odd, apply_padding=True) as share:
            out["dataset_padded"] = [row["k"] for row in gather_object(list(share))]
    return out


@pytest.mark.timeout(120)
def test_split_between_processes_on_two_processes():
    first, second = run_distributed(_shares, 2)
    assert (first["list"], second["list"]) == ([0, 1], [2])
    assert first["list_padded"] == second["list_padded"] == [0, 1, 2, 2]  # rank 1's share padded with the last
    assert (first["tensor"], second["tensor"]) == ([0, 1, 2], [3, 4])
    assert first["dict"] == {"a": [1, 2], "b": ["w", "x"]} and second["dict"] == {"a": [3, 4], "b": ["y", "z"]}
    if HAS_DATASETS:
        assert first["dataset_type"] == second["dataset_type"] == "Dataset"
        assert (first["dataset"], second["dataset"]) == ([0, 1], [2])
        assert first["dataset_padded"][:3] == [0, 1, 2] and len(first["dataset_padded"]) == 4
