"""Which sampler a prepared loader shuffles with: Accelerate's default (the loader's own sampler, its generator
kept equal on every rank) or the seedable sampler (an order of (seed, epoch), the same at any world size).

    generator = accelerate_shuffling(loader.batch_sampler, num_processes=2)   # synchronise it each epoch
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from overdrive.data.sampler import SeedableRandomSampler
from overdrive.runtime import group


def shared_seed(sampler: RandomSampler, data_seed: int | None) -> int:
    """The shuffling seed every process agrees on: ``data_seed``, else rank 0's seed (its sampler's
    generator's, or torch's initial seed) broadcast to all ranks."""
    if data_seed is not None:
        return int(data_seed)
    generator = getattr(sampler, "generator", None)
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    if group.is_distributed():
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = box[0]
    return int(seed)


def seedable_batch_sampler(batch_sampler: Iterable[list[int]], data_seed: int | None) -> Iterable[list[int]]:
    """``batch_sampler`` with a plain ``RandomSampler`` replaced by a ``SeedableRandomSampler``.

    Only the exact torch classes are replaced: a subclass or custom sampler may carry logic we cannot
    rebuild, so it is kept and sharded by batches.
    """
    if type(batch_sampler) is not BatchSampler or type(batch_sampler.sampler) is not RandomSampler:
        return batch_sampler
    random_sampler = batch_sampler.sampler
    sampler = SeedableRandomSampler(random_sampler.data_source, replacement=random_sampler.replacement,
                                    num_samples=random_sampler._num_samples,
                                    seed=shared_seed(random_sampler, data_seed))
    return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)


def get_sampler(dataloader: DataLoader) -> Any:
    """The sampler inside ``dataloader``'s batch sampler (or inside a batch sampler given as its sampler)."""
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    return getattr(holder, "sampler", None)


def accelerate_shuffling(batch_sampler: Any, num_processes: int) -> torch.Generator | None:
    """Accelerate's default for several processes: the user's sampler is kept and its generator kept equal on
    every rank (rank 0's state at each epoch start). A sampler without a generator gets one here, seeded from
    torch's global generator as Accelerate seeds it (the draw happens on every rank alike). Returns the
    generator to synchronise, or ``None`` (one process, or no sampler with a generator)."""
    sampler = getattr(batch_sampler, "sampler", None)
    if num_processes == 1 or sampler is None or not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler.generator


def _find_seedable(batch_sampler: Any) -> SeedableRandomSampler | None:
    """The SeedableRandomSampler inside a chain of batch-sampler wrappers, if any."""
    node = batch_sampler
    for _ in range(8):  # wrappers nest a few levels deep at most
        if isinstance(node, SeedableRandomSampler):
            return node
        # explicit None checks: truth-testing a sampler calls len(), which infinite samplers refuse
        inner = None
        for name in ("shard", "batch_sampler", "sampler"):
            inner = getattr(node, name, None)
            if inner is not None:
                break
        if inner is None:
            return None
        node = inner
    return None
