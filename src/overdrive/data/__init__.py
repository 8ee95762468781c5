"""Prepared data loaders: each process's share of the data, in a seeded order, resumable mid-epoch.

    from overdrive.data import prepare_data_loader
    loader = prepare_data_loader(DataLoader(dataset, batch_size=8, shuffle=True))

Names are imported on first use: a loader that is not dispatched never loads ``dispatch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "DataLoaderDispatcher": "overdrive.data.dispatch",
    "slice_batch": "overdrive.data.dispatch",
    "DataLoaderShard": "overdrive.data.loader",
    "DataLoaderStateMixin": "overdrive.data.loader",
    "get_sampler": "overdrive.data.shuffling",
    "SkipDataLoader": "overdrive.data.loader",
    "prepare_data_loader": "overdrive.data.prepare",
    "skip_first_batches": "overdrive.data.prepare",
    "BatchSamplerShard": "overdrive.data.sampler",
    "DispatchBatchSampler": "overdrive.data.sampler",
    "DispatchedIterable": "overdrive.data.sampler",
    "IterableDatasetShard": "overdrive.data.sampler",
    "SeedableRandomSampler": "overdrive.data.sampler",
    "SkipBatchSampler": "overdrive.data.sampler",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.data.dispatch import DataLoaderDispatcher, slice_batch
    from overdrive.data.loader import DataLoaderShard, DataLoaderStateMixin, SkipDataLoader
    from overdrive.data.prepare import prepare_data_loader, skip_first_batches
    from overdrive.data.sampler import (
        BatchSamplerShard,
        DispatchBatchSampler,
        DispatchedIterable,
        IterableDatasetShard,
        SeedableRandomSampler,
        SkipBatchSampler,
    )
    from overdrive.data.shuffling import get_sampler
