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
            if kind == "seedable":  # a full pass moves the sampler to its next epoch, on either path
                for path in (lambda shard: list(shard), lambda shard: list(shard._own_batches())):
                    shard = _shard(*case)
                    path(shard)
                    assert shard.batch_sampler.sampler.epoch == 1, case  # pyright: ignore[reportAttributeAccessIssue]
            checked += 1
    assert checked == 6 * 3 * 3 * 2 * 2 * 3 * 2  # every rank of every case


@pytest.mark.parametrize("own_generator", [True, False])
def test_random_sampler_order_draws_as_iterating_it(own_generator):
    """The order cut at once from torch's RandomSampler is the one iterating it yields, and both leave the
    sampler's generator and torch's global generator in the same state (a later draw would differ otherwise)."""
    from overdrive.data.sampler import _epoch_order

    for length, num_samples in [(1, None), (2, None), (7, None), (16, None), (16, 16)]:
        states = []
        for read in (list, _epoch_order):
            torch.manual_seed(3)
            generator = torch.Generator().manual_seed(11) if own_generator else None
            sampler = RandomSampler(range(length), num_samples=num_samples, generator=generator)
            order = read(sampler)
            after = (torch.randint(10**9, (4,)).tolist(),
                     torch.randint(10**9, (4,), generator=generator).tolist() if generator is not None else None)
            states.append((order, after))
        assert states[0] == states[1], (length, num_samples)
        assert len(states[0][0]) == (num_samples or length)


def test_samplers_that_draw_as_they_go_take_the_general_path():
    """A RandomSampler with replacement or with ``num_samples`` other than the data's length draws more random
    numbers as its indices are read: its epoch is not drawn up front."""
    from overdrive.data.sampler import _plain_batches

    def plain(**kwargs: object) -> bool:
        return _plain_batches(BatchSampler(RandomSampler(range(16), **kwargs), 4, False))  # pyright: ignore[reportArgumentType]

    assert plain() and plain(num_samples=16)
    assert not plain(num_samples=5) and not plain(num_samples=33) and not plain(replacement=True)


def test_one_process_draws_where_torchs_batch_sampler_draws():
    """With one process the shard cuts the epoch at once too; the random numbers are drawn at the same points as
    iterating torch's BatchSampler draws them (the permutation at the first batch, the unused one where the
    batch sampler reaches its end: before a short last batch, or on the request after the last full one),
    checked after every batch for a generator the user holds and for torch's global one. Several processes:
    against the real Accelerate, tests/data/test_shuffle_accelerate_parity.py."""
    for length, size, drop_last, own in itertools.product([16, 17, 23, 40], [4, 8], [False, True], [True, False]):
        states = []
        for shard in (False, True):
            torch.manual_seed(5)
            generator = torch.Generator().manual_seed(9) if own else None
            batch_sampler = BatchSampler(RandomSampler(range(length), generator=generator), size, drop_last)
            seen = []
            for batch in itertools.chain(BatchSamplerShard(batch_sampler, 1, 0) if shard else batch_sampler, [None]):
                seen.append((batch, torch.random.get_rng_state().numpy().tobytes(),
                             generator.get_state().numpy().tobytes() if generator is not None else None))
            states.append(seen)
        assert states[0] == states[1], (length, size, drop_last, own)


@pytest.mark.parametrize("checked", [True, False])
def test_a_drawn_but_unused_permutation_leaves_the_generator_where_randperm_does(checked, monkeypatch):
    """The permutation torch's RandomSampler draws after its last index is not built, only drawn
    (``_draw_as_randperm``); the generator must end where ``torch.randperm`` leaves it, on the cheap path and on
    the fallback taken when this torch's draws do not match (``_fill_draws_as_randperm`` false)."""
    from overdrive.data import sampler as sampler_module

    if not checked:
        monkeypatch.setattr(sampler_module, "_fill_draws_as_randperm", lambda: False)
    for size in [1, 2, 3, 17, 1000, 12_800]:
        drawn, built = torch.Generator().manual_seed(size), torch.Generator().manual_seed(size)
        sampler_module._draw_as_randperm(size, drawn)
        torch.randperm(size, generator=built)
        assert torch.equal(drawn.get_state(), built.get_state()), size
        assert torch.randint(10**9, (3,), generator=drawn).tolist() == \
            torch.randint(10**9, (3,), generator=built).tolist()
    assert sampler_module._fill_draws_as_randperm() is checked  # torch 2.13's draws do match


def test_each_batch_is_its_own_list_made_when_asked():
    """The shard hands out one fresh list per batch, sliced when the DataLoader asks for it, not a hundred made
    at the epoch's start (which cost the 2-process loader gen-0 garbage collections): the batch lists of one
    epoch are distinct objects, and the first batch exists before the later ones are made."""
    import gc

    shard = BatchSamplerShard(BatchSampler(RandomSampler(range(640), generator=torch.Generator().manual_seed(1)),
                                           64, False), 2, 1)
    def batch_sized_lists() -> int:
        return sum(type(o) is list and len(o) == 64 for o in gc.get_objects())

    before = batch_sized_lists()
    iterator = iter(shard)
    first = next(iterator)
    made = batch_sized_lists() - before
    rest = list(iterator)
    assert len(rest) == 4 and len({id(b) for b in [first, *rest]}) == 5
    assert 1 <= made <= 2  # this batch (and at most one made ahead), not the epoch's five
    first.append(-1)  # a batch may be changed by its user without touching another
    assert all(len(b) == 64 for b in rest)
