"""The batch sampler shard's fast paths hand out exactly the batches of the general path: one process
(the batch sampler's own batches) and several processes over torch's BatchSampler (the epoch cut at once)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from overdrive.data.sampler import BatchSamplerShard, SeedableRandomSampler


def _sampler(kind: str, length: int) -> object:
    data = range(length)
    if kind == "sequential":
        return SequentialSampler(data)
    if kind == "random":
        return RandomSampler(data, generator=torch.Generator().manual_seed(7))
    return SeedableRandomSampler(data, seed=7)


def _shard(kind: str, length: int, size: int, drop_last: bool, n: int, rank: int, even: bool,
           skip: int) -> BatchSamplerShard:
    """A fresh shard each time: a random sampler with a fresh generator draws the same order."""
    shard = BatchSamplerShard(BatchSampler(_sampler(kind, length), size, drop_last), n, rank, even_batches=even)
    shard.skip_batches = skip
    return shard


@pytest.mark.parametrize("kind", ["sequential", "random", "seedable"])
def test_fast_paths_hand_out_the_general_paths_batches(kind):
    checked = 0
    for length, size, n, drop_last, even, skip in itertools.product(
            [1, 5, 16, 17, 23, 40], [1, 4, 8], [1, 2, 3], [False, True], [True, False], [0, 1, 3]):
        for rank in range(n):
            case = (kind, length, size, drop_last, n, rank, even, skip)
            fast = [list(b) for b in _shard(*case)]
            general = [list(b) for b in _shard(*case)._own_batches()]
            assert fast == general, case
            assert len(fast) == max(len(_shard(*case)) - skip, 0)
            checked += 1
    assert checked == 6 * 3 * 3 * 2 * 2 * 3 * 2  # every rank of every case
