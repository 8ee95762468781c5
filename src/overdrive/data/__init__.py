"""Prepared data loaders: each process's share of the data, in a seeded order, resumable mid-epoch.

    from overdrive.data import prepare_data_loader
    loader = prepare_data_loader(DataLoader(dataset, batch_size=8, shuffle=True))
"""

from overdrive.data.dispatch import DataLoaderDispatcher, slice_batch
from overdrive.data.loader import DataLoaderShard, SkipDataLoader
from overdrive.data.prepare import prepare_data_loader, skip_first_batches
from overdrive.data.sampler import (
    BatchSamplerShard,
    DispatchBatchSampler,
    DispatchedIterable,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DispatchBatchSampler",
    "DispatchedIterable",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
    "slice_batch",
]
