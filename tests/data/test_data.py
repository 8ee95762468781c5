"""Prepared data loaders without a process group: sharding logic with explicit num_processes/process_index."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, Sampler

from overdrive.data import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
    skip_first_batches,
)
from overdrive.training.state import GradientState


@pytest.fixture(autouse=True)
def fresh_gradient_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


class CountingDataset(Dataset):
    """range(n) that counts the samples it loads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.loaded.append(index)
        return index


class RangeIterable(IterableDataset):
    def __init__(self, n: int, sized: bool = True) -> None:
        self.n = n
        self.sized = sized
        self.epochs: list[int] = []

    def __iter__(self):
        return iter(range(self.n))

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("no length")
        return self.n


def batches(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def expected_shards(stream: list[int], n: int, per: int, split: bool, even: bool, drop_last: bool) -> list[list]:
    """What each process must yield: step s of process i is items (s*n+i)*per ... of the global stream,
    trimmed (drop_last), wrapped around to the start (even_batches) or left short (uneven)."""
    total = per * n
    if drop_last:
        stream = stream[: len(stream) // total * total]
    elif even and n > 1:
        padded = math.ceil(len(stream) / total) * total
        stream = stream + [stream[k % len(stream)] for k in range(padded - len(stream))]
    steps = math.ceil(len(stream) / total)
    shards = []
    for i in range(n):
        pieces = [stream[(s * n + i) * per:(s * n + i + 1) * per] for s in range(steps)]
        shards.append([piece for piece in pieces if piece])
    return shards


GRID = [(n, length, per, split, even, drop_last)
        for n in (2, 3) for length in (24, 25, 7) for per in (2, 3)
        for split in (False, True) for even in (True, False) for drop_last in (False, True)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n,length,per,split,even,drop_last", GRID)
def test_map_style_shards_reproduce_single_process_order(n, length, per, split, even, drop_last, shuffle):
    batch_size = per * n if split else per

    def make(num, index, size=batch_size, drop=drop_last):
        loader = DataLoader(list(range(length)), batch_size=size, shuffle=shuffle, drop_last=drop)
        return prepare_data_loader(loader, num_processes=num, process_index=index, split_batches=split,
                                   even_batches=even, use_seedable_sampler=True, data_seed=11)

    stream = [x for b in make(1, 0, size=1, drop=False) for x in b.tolist()]  # the single-process order
    assert sorted(stream) == list(range(length))
    if not shuffle:
        assert stream == list(range(length))
    expected = expected_shards(stream, n, per, split, even, drop_last)
    got = []
    for i in range(n):
        loader = make(n, i)
        got.append(batches(loader))
        assert len(loader) == len(got[i])
        assert loader.batch_size == per and loader.total_batch_size == per * n
        assert loader.remainder == (-1 if drop_last else length % (per * n))
    assert got == expected
    if even or drop_last:
        assert len({len(g) for g in got}) == 1 and all(len(b) == per for g in got for b in g)
    if not even and not drop_last:  # each sample exactly once per epoch
        assert sorted(x for g in got for b in g for x in b) == list(range(length))


@pytest.mark.parametrize("n,length,per,split,even,drop_last", GRID)
def test_iterable_shards_reproduce_single_process_order(n, length, per, split, even, drop_last):
    batch_size = per * n if split else per
    # even_batches=False does not apply to iterable data (as in Accelerate): the last global batch is padded
    expected = expected_shards(list(range(length)), n, per, split, True, drop_last)
    for i in range(n):
        loader = prepare_data_loader(DataLoader(RangeIterable(length), batch_size=batch_size, drop_last=drop_last),
                                     num_processes=n, process_index=i, split_batches=split, even_batches=even,
                                     dispatch_batches=False)
        assert isinstance(loader, DataLoaderShard) and isinstance(loader.dataset, IterableDatasetShard)
        assert batches(loader) == expected[i]
        assert len(loader) == len(expected[i])
        assert len(loader.dataset) == sum(len(b) for b in expected[i])
        assert loader.remainder == (-1 if drop_last else length % (per * n))


def test_same_shuffled_global_order_at_any_world_size():
    def global_order(n):
        shards = [batches(prepare_data_loader(DataLoader(range(30), batch_size=5, shuffle=True),
                                              num_processes=n, process_index=i, use_seedable_sampler=True, data_seed=3)) for i in range(n)]
        return [x for step in zip(*shards) for b in step for x in b]

    one = global_order(1)
    assert sorted(one) == list(range(30)) and one != list(range(30))
    assert global_order(2) == one
    assert global_order(3) == one


def test_epochs_advance_and_set_epoch_selects_one():
    loader = prepare_data_loader(DataLoader(range(20), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=5)
    epochs = [sum(batches(loader), []) for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3  # each epoch its own order
    assert loader.epoch == 2
    other = prepare_data_loader(DataLoader(range(20), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=5)
    other.set_epoch(1)
    assert sum(batches(other), []) == epochs[1]
    other.set_epoch(1)  # set again: the same epoch again
    assert sum(batches(other), []) == epochs[1]
    assert sum(batches(other), []) == epochs[2]  # then it advances by itself


def test_default_seed_is_torch_initial_seed_or_the_generator_seed():
    torch.manual_seed(1234)
    loader = prepare_data_loader(DataLoader(range(10), batch_size=2, shuffle=True), use_seedable_sampler=True)
    assert loader.state_dict()["seed"] == 1234
    expected = SeedableRandomSampler(range(10), seed=1234)
    assert sum(batches(loader), []) == list(expected)
    generator = torch.Generator().manual_seed(99)
    loader = prepare_data_loader(DataLoader(range(10), batch_size=2, shuffle=True, generator=generator),
                                 use_seedable_sampler=True)
    assert loader.state_dict()["seed"] == 99
    assert loader.generator is generator  # the user's generator (worker seeds) is kept


def test_seedable_sampler_is_a_pure_function_of_seed_and_epoch():
    a, b = SeedableRandomSampler(range(50), seed=1), SeedableRandomSampler(range(50), seed=1)
    torch.rand(10)  # global RNG use must not matter
    assert list(a) == list(b) and sorted(a) == list(range(50))
    b.set_epoch(1)
    assert list(a) != list(b)
    more = SeedableRandomSampler(range(5), num_samples=12, seed=2)
    assert len(list(more)) == 12 and sorted(list(more)[:10]) == sorted(list(range(5)) * 2)
    drawn = list(SeedableRandomSampler(range(5), replacement=True, num_samples=40, seed=2))
    assert len(drawn) == 40 and set(drawn) <= set(range(5)) and len(set(drawn)) < 40


@pytest.mark.parametrize(("size", "num_samples"), [(50, None), (7, 3), (5, 12), (5, 15), (1, 4)])
def test_seedable_sampler_order_is_torch_random_samplers_with_a_seed_and_epoch_generator(size, num_samples):
    # The order is part of every checkpoint's meaning (a resumed epoch recomputes it), so it is pinned to
    # torch's own RandomSampler drawing from a generator seeded with seed + epoch.
    sampler = SeedableRandomSampler(range(size), num_samples=num_samples, seed=11)
    for epoch in (0, 3):
        sampler.set_epoch(epoch)
        reference = RandomSampler(range(size), num_samples=num_samples,
                                  generator=torch.Generator().manual_seed(11 + epoch))
        assert sampler.order() == list(sampler) == list(reference)
        assert sampler.epoch == epoch + 1  # a full pass moves to the next epoch, as Accelerate's sampler
    # a list's iterator chained in C, not a generator: no frame resume per sample (bench/loader_overhead.py)
    assert type(iter(sampler)) is itertools.chain
    drawn = SeedableRandomSampler(range(5), replacement=True, num_samples=40, seed=2)
    assert list(drawn) == torch.randint(5, (40,), generator=torch.Generator().manual_seed(2)).tolist()


def test_end_of_dataloader_is_set_on_the_last_batch_only():
    state = GradientState()
    loader = prepare_data_loader(DataLoader(range(10), batch_size=3), num_processes=2, process_index=1)
    seen = []
    for batch in loader:
        assert state.active_dataloader is loader and state.in_dataloader
        seen.append((loader.end_of_dataloader, state.end_of_dataloader, state.remainder,
                     loader.batches_yielded, batch.tolist()))
    assert [s[:2] for s in seen] == [(False, False), (True, True)]
    assert seen[-1][2] == 10 % 6 and [s[3] for s in seen] == [1, 2]
    assert state.active_dataloader is None and not state.end_of_dataloader


def test_breaking_out_removes_the_loader_from_gradient_state():
    state = GradientState()
    outer = prepare_data_loader(DataLoader(range(6), batch_size=2))
    inner = prepare_data_loader(DataLoader(range(6), batch_size=2))
    for _ in outer:
        for _ in inner:
            assert state.active_dataloader is inner
            break
        assert state.active_dataloader is outer
    assert state.active_dataloader is None
    assert outer.batches_yielded == 3 and inner.batches_yielded == 1


@pytest.mark.parametrize("n,split", [(1, False), (2, False), (3, True)])
def test_state_dict_resumes_mid_epoch_without_loading_skipped_samples(n, split):
    def make(dataset):
        loader = DataLoader(dataset, batch_size=3 if split else 2, shuffle=True)
        return prepare_data_loader(loader, num_processes=n, process_index=n - 1, split_batches=split,
                                   exact_resume=True)

    torch.manual_seed(7)
    first = make(CountingDataset(23))
    batches(first)  # epoch 0
    run = iter(first)
    head = [next(run).tolist() for _ in range(2)]  # epoch 1, two batches in
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_yielded"] == 2
    tail = [b.tolist() for b in run]
    next_epoch = batches(first)

    torch.manual_seed(8)  # a different run: the seed comes from the state
    dataset = CountingDataset(23)
    resumed = make(dataset)
    resumed.load_state_dict(state)
    assert batches(resumed) == tail
    assert sorted(dataset.loaded) == sorted(x for b in tail for x in b)  # skipped samples never loaded
    assert batches(resumed) == next_epoch
    assert head and tail


def test_state_saved_at_the_end_of_an_epoch_resumes_with_the_next_epoch():
    def make():
        return prepare_data_loader(DataLoader(range(12), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=1)

    loader = make()
    for _ in loader:
        state = loader.state_dict()  # saved inside the loop, at the last batch
    expected = batches(loader)
    resumed = make()
    resumed.load_state_dict(state)
    assert batches(resumed) == expected


def test_explicit_set_epoch_is_kept_through_state_dict():
    loader = prepare_data_loader(DataLoader(range(12), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=1)
    loader.set_epoch(5)
    state = loader.state_dict()
    assert state["epoch_set"]
    resumed = prepare_data_loader(DataLoader(range(12), batch_size=4, shuffle=True), use_seedable_sampler=True, data_seed=1)
    resumed.load_state_dict(state)
    assert batches(resumed) == batches(loader)


def test_iterable_state_dict_resumes_by_reading():
    def make():
        loader = DataLoader(RangeIterable(20), batch_size=2)
        return prepare_data_loader(loader, num_processes=2, process_index=0, dispatch_batches=False)

    loader = make()
    run = iter(loader)
    next(run), next(run)
    state = loader.state_dict()
    tail = [b.tolist() for b in run]
    resumed = make()
    resumed.load_state_dict(state)
    assert batches(resumed) == tail == [[8, 9], [12, 13], [16, 17]]
    assert resumed.dataset.dataset.epochs == [0]  # the dataset is told the epoch


def test_skip_first_batches_on_a_prepared_loader_skips_once():
    dataset = CountingDataset(20)
    loader = prepare_data_loader(DataLoader(dataset, batch_size=2, shuffle=True), num_processes=2,
                                 process_index=0, use_seedable_sampler=True, data_seed=4)
    reference = prepare_data_loader(DataLoader(range(20), batch_size=2, shuffle=True), num_processes=2,
                                    process_index=0, use_seedable_sampler=True, data_seed=4)
    full = [batches(reference) for _ in range(2)]
    assert skip_first_batches(loader, 3) is loader
    assert batches(loader) == full[0][3:]
    assert len(dataset.loaded) == 4  # two batches of two: the skipped ones were never loaded
    assert batches(loader) == full[1]  # the next epoch is whole


def test_skip_first_batches_on_plain_loaders():
    dataset = CountingDataset(10)
    skipped = skip_first_batches(DataLoader(dataset, batch_size=3), 2)
    assert batches(skipped) == [[6, 7, 8], [9]] and len(skipped) == 2
    assert dataset.loaded == [6, 7, 8, 9]
    iterable = skip_first_batches(DataLoader(RangeIterable(10), batch_size=3), 1)
    assert batches(iterable) == [[3, 4, 5], [6, 7, 8], [9]]
    with pytest.raises(ValueError, match="num_batches=-1"):
        skip_first_batches(DataLoader(dataset, batch_size=3), -1)


def test_even_batches_can_be_toggled_between_iterations():
    loader = prepare_data_loader(DataLoader(range(10), batch_size=4), num_processes=2, process_index=1)
    assert batches(loader) == [[4, 5, 6, 7], [2, 3, 4, 5]] and len(loader) == 2
    loader.even_batches = False
    assert not loader.even_batches
    assert batches(loader) == [[4, 5, 6, 7]] and len(loader) == 1


def test_user_settings_survive_and_workers_work():
    def collate(samples):
        return {"x": torch.tensor(samples) * 10}

    def init(worker_id):
        pass

    plain = DataLoader(CountingDataset(12), batch_size=2, collate_fn=collate, num_workers=2, worker_init_fn=init,
                       timeout=30, persistent_workers=True, prefetch_factor=3)
    loader = prepare_data_loader(plain, num_processes=2, process_index=1)
    assert (loader.collate_fn, loader.num_workers, loader.worker_init_fn, loader.timeout) == (collate, 2, init, 30)
    assert loader.persistent_workers and loader.prefetch_factor == 3
    assert [b["x"].tolist() for b in loader] == [[20, 30], [60, 70], [100, 110]]
    skip_first_batches(loader, 2)
    assert [b["x"].tolist() for b in loader] == [[100, 110]]


def test_custom_samplers_are_kept_and_sharded_by_batch():
    class Reverse(Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))

        def __len__(self):
            return self.n

    loader = prepare_data_loader(DataLoader(range(8), batch_size=2, sampler=Reverse(8)), num_processes=2,
                                 process_index=0)
    assert batches(loader) == [[7, 6], [3, 2]]
    assert isinstance(loader.batch_sampler.batch_sampler.sampler, Reverse)

    class Buckets(Sampler):  # variable-size batches, no batch_size attribute
        def __iter__(self):
            return iter([[0], [1, 2], [3, 4, 5], [6]])

        def __len__(self):
            return 4

    shards = [batches(prepare_data_loader(DataLoader(range(7), batch_sampler=Buckets()), num_processes=3,
                                          process_index=i)) for i in range(3)]
    assert shards == [[[0], [6]], [[1, 2], [0]], [[3, 4, 5], [1, 2]]]


def test_put_on_device_moves_batches():
    loader = prepare_data_loader(DataLoader(range(4), batch_size=2), device=torch.device("meta"), put_on_device=True)
    assert all(b.device.type == "meta" for b in loader)
    loader = prepare_data_loader(DataLoader(range(4), batch_size=2), device=torch.device("meta"))
    assert all(b.device.type == "cpu" for b in loader)


def test_single_process_dispatch_reads_locally():
    loader = prepare_data_loader(DataLoader(RangeIterable(7), batch_size=3))
    assert isinstance(loader, DataLoaderDispatcher)
    assert batches(loader) == [[0, 1, 2], [3, 4, 5], [6]] and len(loader) == 3
    mapped = prepare_data_loader(DataLoader(range(7), batch_size=3), dispatch_batches=True)
    assert isinstance(mapped, DataLoaderDispatcher) and batches(mapped) == [[0, 1, 2], [3, 4, 5], [6]]
    skip_first_batches(mapped, 2)
    assert batches(mapped) == [[6]] and mapped.end_of_dataloader


def test_errors_name_the_bad_values():
    with pytest.raises(ValueError, match=r"batch_size=5 and num_processes=2"):
        prepare_data_loader(DataLoader(range(10), batch_size=5), num_processes=2, process_index=0,
                            split_batches=True)
    with pytest.raises(ValueError, match="batch_size=None and batch_sampler=None"):
        prepare_data_loader(DataLoader(range(10), batch_size=None))
    with pytest.raises(ValueError, match="process_index=2"):
        BatchSamplerShard([[0]], num_processes=2, process_index=2)
    with pytest.raises(RuntimeError, match="process group"):
        prepare_data_loader(DataLoader(RangeIterable(4), batch_size=2), num_processes=2, process_index=0)


def test_iterable_without_length():
    loader = prepare_data_loader(DataLoader(RangeIterable(5, sized=False), batch_size=2), num_processes=2,
                                 process_index=0, dispatch_batches=False)
    assert batches(loader) == [[0, 1], [4, 0]]
    assert loader.remainder == -1 and loader.total_dataset_length is None
    with pytest.raises(TypeError):
        len(loader)


def test_preparing_twice_returns_the_prepared_loader():
    loader = prepare_data_loader(DataLoader(range(4), batch_size=2), num_processes=2, process_index=0)
    assert prepare_data_loader(loader, num_processes=2, process_index=0) is loader
