"""Data-loader behaviour libraries rely on: the length of a loader after skip_first_batches, and
use_stateful_dataloader without torchdata (with it: tests/data/test_stateful_dataloader.py)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from overdrive import DataLoaderConfiguration, skip_first_batches
from overdrive.data import prepare_data_loader
from overdrive.helpers.imports import is_torchdata_stateful_dataloader_available


def test_skip_first_batches_length_is_what_remains():
    data = TensorDataset(torch.arange(20.0))
    loader = prepare_data_loader(DataLoader(data, batch_size=4), num_processes=1, process_index=0)
    assert len(loader) == 5
    skipped = skip_first_batches(loader, 2)
    assert len(skipped) == 3
    assert [b[0].tolist() for b in skipped] == [[8.0, 9.0, 10.0, 11.0], [12.0, 13.0, 14.0, 15.0],
                                                [16.0, 17.0, 18.0, 19.0]]
    assert len(loader) == 5  # the skip applied once; the next epoch is whole
    plain = skip_first_batches(DataLoader(data, batch_size=4), 4)
    assert len(plain) == 1 and [b[0].tolist() for b in plain] == [[16.0, 17.0, 18.0, 19.0]]


def test_stateful_dataloader_without_torchdata_is_a_clear_error(monkeypatch):
    from overdrive import Accelerator

    # torchdata made unimportable for this test (it is a test dependency, so installed in CI)
    monkeypatch.setitem(sys.modules, "torchdata", None)
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    assert not is_torchdata_stateful_dataloader_available()
    with pytest.raises(ValueError, match=r"use_stateful_dataloader=True\) needs torchdata.*pip install"):
        Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
