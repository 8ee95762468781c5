"""A prepared loader over the user's own ``RandomSampler`` (the default, without ``use_seedable_sampler``) hands
out exactly the real Accelerate's batches, per rank and per epoch, and draws the same random numbers: the global
generator and the sampler's generator are left as Accelerate leaves them after every epoch. Each rank is built
in this one process (``num_processes``/``process_index`` given), since neither library communicates without
``rng_types``; uneven lengths, ``num_samples``, ``even_batches``, ``drop_last`` and ``skip_first_batches`` too."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

pytestmark = pytest.mark.requires("accelerate")

EPOCHS = 3


def _run(package: str, length: int, processes: int, rank: int, even: bool, drop_last: bool,
         num_samples: int | None, user_generator: bool, skip: int) -> list:
    """Each epoch's batches (as index lists), with a draw of the global and the sampler's generator after it."""
    data_module = importlib.import_module(f"{package}.data_loader")
    torch.manual_seed(5)
    data = TensorDataset(torch.arange(length))
    generator = torch.Generator().manual_seed(17) if user_generator else None
    sampler = RandomSampler(data, num_samples=num_samples, generator=generator)
    loader = data_module.prepare_data_loader(DataLoader(data, batch_size=4, sampler=sampler, drop_last=drop_last),
                                             num_processes=processes, process_index=rank, even_batches=even)
    if skip:
        loader = data_module.skip_first_batches(loader, skip)
    epochs = []
    for _ in range(EPOCHS):
        batches = [batch[0].tolist() for batch in loader]
        # a draw from each generator after the epoch: it differs if either was drawn from differently
        epochs.append((batches, torch.randint(10**9, (2,)).tolist(),
                       torch.randint(10**9, (2,), generator=sampler.generator).tolist()))
        if skip:  # Accelerate's skipping loader skips at every epoch, overdrive's once: compare the first
            break
    return epochs


def test_prepared_random_sampler_as_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    checked = 0
    try:
        for length, processes, even, drop_last, num_samples, user_generator, skip in itertools.product(
                [13, 16, 23], [2, 3], [True, False], [False, True], [None, 29], [False, True], [0, 2]):
            for rank in range(processes):
                case = (length, processes, rank, even, drop_last, num_samples, user_generator, skip)
                reference = _run("accelerate", *case)
                assert _run("overdrive", *case) == reference, case
                checked += bool(reference[0][0])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert checked > 300  # of 480 cases, those with batches (a short epoch with drop_last may have none)


def _draws_per_batch(package: str, length: int, processes: int, rank: int, even: bool, drop_last: bool,
                     sampling: dict) -> list:
    """The batches of one epoch, each with the sampler generator's and the global generator's state at the
    moment the loop body gets it (a loop that draws from either between batches would see these)."""
    data_module = importlib.import_module(f"{package}.data_loader")
    torch.manual_seed(5)
    data = TensorDataset(torch.arange(length))
    generator = torch.Generator().manual_seed(17)
    loader = data_module.prepare_data_loader(
        DataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=generator, **sampling), drop_last=drop_last),
        num_processes=processes, process_index=rank, even_batches=even)
    return [(batch[0].tolist(), generator.get_state().numpy().tobytes(), torch.random.get_rng_state().numpy().tobytes())
            for batch in loader]


@pytest.mark.parametrize("sampling", [{}, {"replacement": True}, {"num_samples": 29}], ids=str)
def test_random_numbers_are_drawn_between_the_same_batches_as_accelerate(sampling):
    """Not only after the epoch: the sampler's permutation and the one it draws unused are drawn between the same
    two batches as in Accelerate (1 to 3 processes, uneven lengths, even_batches, drop_last); so are the numbers
    of a sampler that draws as its indices are read (with replacement: 32 at a time; more samples than data: a
    permutation each pass), which takes the shard's general path."""
    from accelerate.state import AcceleratorState, GradientState

    try:
        for length, processes, even, drop_last in itertools.product([13, 16, 23, 32], [1, 2, 3], [True, False],
                                                                    [False, True]):
            for rank in range(processes):
                case = (length, processes, rank, even, drop_last)
                assert _draws_per_batch("overdrive", *case, sampling) == _draws_per_batch("accelerate", *case, sampling), case
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
