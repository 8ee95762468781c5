"""Mismatched collectives: inputs whose structure differs across ranks raise on every rank (no abort, no
data filed under the wrong key), and the process group stays usable. Real gloo groups of 2 processes."""

from __future__ import annotations

from datetime import timedelta

import torch

from tests.support.distributed import run_distributed


def _raises(fn):
    from overdrive.helpers import ops

    try:
        fn()
    except ops.DistributedOperationException as error:
        return str(error)
    return None


def _mismatches() -> dict:
    import torch.distributed as dist

    from overdrive.helpers import ops

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    out = {}
    out["keys"] = _raises(lambda: ops.gather({"loss" if rank == 0 else "acc": torch.ones(2)}))
    out["leaves"] = _raises(lambda: ops.gather([torch.ones(2)] * (rank + 1)))
    out["dtype"] = _raises(lambda: ops.gather(torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64)))
    out["reduce"] = _raises(lambda: ops.reduce(torch.ones(2 + rank), reduction="sum"))
    out["broadcast"] = _raises(lambda: ops.broadcast({"a": torch.ones(2)} if rank == 0 else {"b": torch.ones(2)}))
    out["pad"] = _raises(lambda: ops.pad_across_processes([torch.ones(2)] * (rank + 1)))
    many = {f"k{i}": torch.full((rank + 1,), float(i)) for i in range(20)}  # more leaves than the header holds
    out["many"] = {k: v.tolist() for k, v in ops.gather(many).items()}
    if rank == 1:
        many["k19"] = torch.ones(1, 2)
    out["many_bad"] = _raises(lambda: ops.gather(many))
    # after all of that the group still works and agrees
    out["after"] = ops.gather(torch.tensor([rank])).tolist()
    out["reduce_ok"] = ops.reduce(torch.tensor([1.0, 2.0]), reduction="sum").tolist()
    out["uneven_metrics"] = _uneven_metrics()
    return out


def _uneven_metrics() -> dict:
    """gather_for_metrics with even_batches=False where the ranks run different numbers of batches."""
    from torch.utils.data import DataLoader

    from overdrive import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    seen = {}
    for size, batch in ((8, 3), (9, 4), (10, 3)):
        loader = accelerator.prepare(DataLoader(torch.arange(size) * 10, batch_size=batch))
        values, objects = [], []
        for step in loader:
            values += accelerator.gather_for_metrics({"v": step})["v"].tolist()
            objects += accelerator.gather_for_metrics(step.tolist(), use_gather_object=True)
        seen[f"{size}/{batch}"] = (len(loader), values, objects)
    return seen


def test_mismatched_structures_raise_on_every_rank_and_name_each_rank():
    results = run_distributed(_mismatches, 2, timeout=120)
    for out in results:
        assert "rank 0: {'loss': float32[2]}; rank 1: {'acc': float32[2]}" in out["keys"]
        assert "rank 0: [float32[2]]; rank 1: [float32[2], float32[2]]" in out["leaves"]
        assert "rank 0: float32[2]; rank 1: float64[2]" in out["dtype"]
        assert out["reduce"].startswith("reduce: ") and "rank 0: float32[2]; rank 1: float32[3]" in out["reduce"]
        assert "rank 0: {'a': float32[2]}; rank 1: {'b': float32[2]}" in out["broadcast"]
        assert out["pad"].startswith("pad_across_processes: ")
        assert out["many"] == {f"k{i}": [float(i)] * 3 for i in range(20)}
        assert "'k19': float32[1, 2]" in out["many_bad"]
        assert out["after"] == [0, 1] and out["reduce_ok"] == [2.0, 4.0]
    for key in results[0]["uneven_metrics"]:
        size, batch = map(int, key.split("/"))
        dataset = [10 * i for i in range(size)]  # what one process iterating the whole loader sees
        steps = [r["uneven_metrics"][key][0] for r in results]
        for rank, out in enumerate(results):
            _, values, objects = out["uneven_metrics"][key]
            # each gathered step is whole: the samples of the steps this rank ran, in order, nothing else
            assert values == dataset[: steps[rank] * batch * 2] and objects == values, (key, rank)
        assert results[0]["uneven_metrics"][key][1] == dataset  # the rank with the most steps sees them all
    # the ranks did run different numbers of batches (8 samples in batches of 3: 2 and 1)
    assert [r["uneven_metrics"]["8/3"][0] for r in results] == [2, 1]
    assert results[0]["keys"] == results[1]["keys"]  # the same error on every rank
