"""Prepared data loaders on real gloo process groups: seed broadcast, dispatching, iterable shards.

Every dispatched result is compared with what the same loader gives with dispatch_batches=False and
explicit num_processes/process_index (pure sharding logic, computed here without a process group).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset

from overdrive.data import SeedableRandomSampler, prepare_data_loader
from overdrive.training.state import GradientState
from tests.data.test_data import expected_shards
from tests.support.distributed import run_distributed


class RichIterable(IterableDataset):
    """Samples of several dtypes and a string; with ``rank0_only`` only rank 0 may read it."""

    def __init__(self, n: int, rank0_only: bool = True) -> None:
        self.n = n
        self.rank0_only = rank0_only

    def __iter__(self):
        if self.rank0_only and dist.is_initialized() and dist.get_rank() != 0:
            raise RuntimeError(f"rank {dist.get_rank()} read the dataset, but dispatching means only rank 0 does")
        for i in range(self.n):
            yield {"x": torch.full((2,), i, dtype=torch.float16), "mask": torch.tensor(i % 2 == 0),
                   "ids": (torch.tensor([i, -i]), i * 10), "name": f"s{i}"}

    def __len__(self) -> int:
        return self.n


class GuardedRange(Dataset):
    """range(n) as a map-style dataset that only rank 0 may read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if dist.get_rank() != 0:
            raise RuntimeError(f"rank {dist.get_rank()} loaded sample {index}, but only rank 0 should")
        return index


def plain(data):
    if isinstance(data, torch.Tensor):
        return (str(data.dtype), data.tolist())
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [plain(v) for v in data]
    return data


def record(loader) -> dict:
    state = GradientState()
    seen = [(plain(batch), loader.end_of_dataloader, state.end_of_dataloader, loader.batches_yielded)
            for batch in loader]
    return {"batches": seen, "len": len(loader)}


def _init() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    return dist.get_rank()


# (name, dataset length, batch size, split_batches, even_batches) for the dispatched iterable cases
CASES_2 = [("rich", 11, 2, False, True), ("rich_split", 11, 4, True, False)]
CASES_3 = [("even", 10, 2, False, True), ("uneven", 10, 2, False, False), ("split_uneven", 10, 3, True, False),
           ("split_even", 10, 3, True, True), ("empty", 0, 2, False, True)]


def dispatched_cases(cases, **extra) -> dict:
    return {name: record(prepare_data_loader(DataLoader(RichIterable(length), batch_size=batch_size),
                                             split_batches=split, even_batches=even, **extra))
            for name, length, batch_size, split, even in cases}


def expected_cases(cases, n: int) -> list[dict]:
    return [{name: record(prepare_data_loader(DataLoader(RichIterable(length), batch_size=batch_size),
                                              num_processes=n, process_index=i, split_batches=split,
                                              even_batches=even, dispatch_batches=False))
             for name, length, batch_size, split, even in cases} for i in range(n)]


def two_ranks() -> dict:
    rank = _init()
    out: dict = {}
    # Ranks seeded differently still agree on rank 0's seed (the seedable sampler).
    torch.manual_seed(100 + rank)
    loader = prepare_data_loader(DataLoader(range(20), batch_size=3, shuffle=True), use_seedable_sampler=True)
    out["place"] = (loader.batch_sampler.num_processes, loader.batch_sampler.process_index)
    out["seed"] = loader.state_dict()["seed"]
    out["shuffled"] = [b.tolist() for b in loader]
    # Accelerate's default: the sampler's generator (made from each rank's own global RNG here) takes rank 0's
    # state at each epoch start, so the ranks' shards of every epoch still split one permutation.
    torch.manual_seed(200 + rank)
    default = prepare_data_loader(DataLoader(range(16), batch_size=2, shuffle=True), rng_types=["generator"])
    out["default_shuffled"] = [[b.tolist() for b in default] for _ in range(2)]

    # rng_types: rank 0's torch RNG state is given to every rank when an iteration starts.
    synced = prepare_data_loader(DataLoader(range(4), batch_size=2), rng_types=["torch", "generator"])
    for _ in synced:
        out["synced_draw"] = torch.rand(1).item()
        break

    out["dispatched"] = dispatched_cases(CASES_2)
    out["iterable_shard"] = record(prepare_data_loader(DataLoader(RichIterable(11, False), batch_size=2),
                                                       dispatch_batches=False))

    # Map-style dispatch, shuffled, resumed mid-epoch from a state dict on fresh loaders.
    def mapped():
        return prepare_data_loader(DataLoader(range(21), batch_size=2, shuffle=True), dispatch_batches=True,
                                   use_seedable_sampler=True, data_seed=5)

    first = mapped()
    run = iter(first)
    head = [next(run).tolist() for _ in range(2)]
    state = first.state_dict()
    tail = [b.tolist() for b in run]
    resumed = mapped()
    resumed.load_state_dict(state)
    out["mapped"] = {"head": head, "tail": tail, "resumed": [b.tolist() for b in resumed]}

    # Iterable dispatch resumed (rank 0 skips by reading).
    def streamed():
        return prepare_data_loader(DataLoader(RichIterable(13), batch_size=2))

    first = streamed()
    run = iter(first)
    next(run)
    state = first.state_dict()
    tail = [plain(b) for b in run]
    resumed = streamed()
    resumed.load_state_dict(state)
    out["streamed"] = {"tail": tail, "resumed": [plain(b) for b in resumed]}

    # One data-parallel group of two ranks (as tensor parallelism will ask): both get the same batches.
    same = prepare_data_loader(DataLoader(RichIterable(5), batch_size=2), num_processes=1, process_index=0)
    out["tp_like"] = [plain(b) for b in same]

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    on_mesh = prepare_data_loader(DataLoader(range(8), batch_size=2), torch_device_mesh=mesh)
    out["mesh"] = [b.tolist() for b in on_mesh]
    return out


def three_ranks() -> dict:
    _init()
    out = {"dispatched": dispatched_cases(CASES_3)}
    out["iterable_shard"] = record(prepare_data_loader(DataLoader(RichIterable(10, False), batch_size=2),
                                                       dispatch_batches=False, even_batches=False))
    out["mapped_uneven"] = record(prepare_data_loader(DataLoader(GuardedRange(10), batch_size=2),
                                                      dispatch_batches=True, even_batches=False))
    return out


@pytest.mark.timeout(120)
def test_two_ranks():
    results = run_distributed(two_ranks, 2)
    assert [r["place"] for r in results] == [(2, 0), (2, 1)]
    assert [r["seed"] for r in results] == [100, 100]
    assert results[0]["synced_draw"] == results[1]["synced_draw"]
    order = list(SeedableRandomSampler(range(20), seed=100))
    assert [r["shuffled"] for r in results] == expected_shards(order, 2, 3, False, True, False)
    for epoch in range(2):
        shards = [r["default_shuffled"][epoch] for r in results]
        assert sorted(x for shard in shards for batch in shard for x in batch) == list(range(16))
    assert results[0]["default_shuffled"][0] != results[0]["default_shuffled"][1]  # a new order each epoch

    expected = expected_cases(CASES_2, 2)
    for rank in range(2):
        assert results[rank]["dispatched"] == expected[rank]
    rich = results[0]["dispatched"]["rich"]["batches"]
    assert rich[0][0]["x"][0] == "torch.float16" and rich[0][0]["mask"][0] == "torch.bool"
    assert rich[0][0]["name"] == ["s0", "s1"] and results[1]["dispatched"]["rich"]["batches"][0][0]["name"] == ["s2", "s3"]
    assert [b[1:3] for b in rich] == [(False, False), (False, False), (True, True)]

    shard_expected = expected_cases([("rich", 11, 2, False, True)], 2)
    assert [r["iterable_shard"] for r in results] == [e["rich"] for e in shard_expected]

    for r in results:
        assert r["mapped"]["resumed"] == r["mapped"]["tail"] and len(r["mapped"]["head"]) == 2
        assert r["streamed"]["resumed"] == r["streamed"]["tail"]
    order = list(SeedableRandomSampler(range(21), seed=5))
    mapped_expected = expected_shards(order, 2, 2, False, True, False)
    assert [r["mapped"]["head"] + r["mapped"]["tail"] for r in results] == mapped_expected

    assert results[0]["tp_like"] == results[1]["tp_like"] and len(results[0]["tp_like"]) == 3
    assert [r["mesh"] for r in results] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


@pytest.mark.timeout(120)
def test_three_ranks_uneven():
    results = run_distributed(three_ranks, 3)
    expected = expected_cases(CASES_3, 3)
    for rank in range(3):
        got = results[rank]["dispatched"]
        assert got == expected[rank]
        # even_batches=False changes nothing for iterable data (as in Accelerate): the last step is padded
        assert len(got["uneven"]["batches"]) == got["uneven"]["len"] == 2
        assert got["uneven"]["batches"][-1][1:3] == (True, True)  # each rank knows its own last batch
        assert got["empty"] == {"batches": [], "len": 0}
        assert got["split_uneven"]["len"] == 4  # the last global batch [9] is padded to [9, 0, 1]
        assert [b[0]["ids"][1] for b in got["split_uneven"]["batches"]][-1] == ("torch.int64", [[90], [0], [10]][rank])
    shard_expected = expected_cases([("uneven", 10, 2, False, False)], 3)
    assert [r["iterable_shard"] for r in results] == [e["uneven"] for e in shard_expected]
    # dispatched, every process gets a part of every step: even_batches=False has no effect (as in Accelerate)
    mapped = [[b[0][1] for b in r["mapped_uneven"]["batches"]] for r in results]
    assert mapped == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [0, 1]]]
    assert [r["mapped_uneven"]["len"] for r in results] == [2, 2, 2]
