"""overdrive.helpers.ops: nested-structure helpers (one process) and the collectives on real gloo groups."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from overdrive.helpers import ops
from tests.support.distributed import run_distributed

Pair = namedtuple("Pair", ["x", "y"])


# ------------------------------------------------------------------------------------------- one process


def test_recursively_apply_keeps_namedtuples_dicts_and_non_tensors():
    data = {"a": Pair(torch.ones(2), [torch.zeros(1), "label"]), "b": (torch.tensor(3),)}
    out = ops.recursively_apply(lambda t: t + 1, data)
    assert isinstance(out["a"], Pair) and isinstance(out["a"].y, list) and isinstance(out["b"], tuple)
    assert out["a"].x.tolist() == [2.0, 2.0] and out["a"].y[0].tolist() == [1.0]
    assert out["a"].y[1] == "label" and out["b"][0].item() == 4
    with pytest.raises(TypeError, match="str"):
        ops.recursively_apply(lambda t: t, ["label"], error_on_other_type=True)


def test_send_to_device_skip_keys():
    data = {"x": torch.ones(2), "mask": torch.ones(2), "nested": Pair(torch.ones(1), 3)}
    out = ops.send_to_device(data, "meta", skip_keys="mask")
    assert out["x"].device.type == "meta" and out["nested"].x.device.type == "meta"
    assert out["mask"].device.type == "cpu" and out["mask"] is data["mask"]
    assert isinstance(out["nested"], Pair) and out["nested"].y == 3
    out = ops.send_to_device(data, "meta", skip_keys=["x", "mask"])
    assert out["x"].device.type == "cpu" and out["nested"].x.device.type == "meta"


def test_convert_to_fp32_only_touches_half_precision():
    out = ops.convert_to_fp32({"h": torch.ones(2, dtype=torch.bfloat16), "i": torch.ones(2, dtype=torch.int64)})
    assert out["h"].dtype == torch.float32 and out["i"].dtype == torch.int64


def test_find_batch_size_device_and_listify():
    data = [{"ids": torch.zeros(5, 3, dtype=torch.long)}, torch.zeros(7)]
    assert ops.find_batch_size(data) == 5
    assert ops.find_batch_size({"scalar": torch.tensor(1.0), "x": torch.zeros(4)}) == 4
    with pytest.raises(ValueError, match="empty"):
        ops.find_batch_size([])
    with pytest.raises(TypeError):
        ops.find_batch_size({"a": "text"})
    assert ops.ignorant_find_batch_size("text") is None
    assert ops.find_device({"a": 1, "b": [torch.zeros(1, device="meta")]}) == torch.device("meta")
    assert ops.find_device([1, "x"]) is None
    listed = ops.listify({"a": torch.tensor([1.5, 2.0], dtype=torch.bfloat16), "b": (torch.tensor(3),)})
    assert listed == {"a": [1.5, 2.0], "b": (3,)}


def test_concatenate_slice_and_data_structure():
    parts = [Pair(torch.zeros(2, 3), {"k": torch.ones(2)}), Pair(torch.ones(1, 3), {"k": torch.zeros(1)})]
    out = ops.concatenate(parts)
    assert isinstance(out, Pair) and out.x.shape == (3, 3) and out.y["k"].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(TypeError, match="str"):
        ops.concatenate(["a", "b"])
    sliced = ops.slice_tensors(out, slice(0, 2))
    assert sliced.x.shape == (2, 3) and sliced.y["k"].shape == (2,)
    structure = ops.get_data_structure({"a": torch.zeros(2, 3, dtype=torch.int16)})
    assert structure["a"].shape == (2, 3) and structure["a"].dtype == torch.int16
    made = ops.initialize_tensors(structure)
    assert made["a"].shape == (2, 3) and made["a"].dtype == torch.int16
    assert ops.get_shape([torch.zeros(4, 1)]) == [[4, 1]]
    assert ops.is_namedtuple(Pair(1, 2)) and not ops.is_namedtuple((1, 2))


def test_collectives_without_a_process_group():
    data = {"a": torch.arange(3), "b": [torch.tensor(2.0)]}
    assert ops.gather(data) is data
    assert ops.broadcast(data) is data
    assert ops.pad_across_processes(data) is data
    assert ops.gather_object(["x", "y"]) == ["x", "y"] and ops.gather_object({"k": 1}) == [{"k": 1}]
    objects = [1, 2]
    assert ops.broadcast_object_list(objects) is objects
    reduced = ops.reduce(data, reduction="sum", scale=2.0)
    assert reduced["a"].tolist() == [0.0, 2.0, 4.0] and reduced["b"][0].item() == 4.0
    assert reduced["a"] is not data["a"]
    mean = ops.reduce(torch.tensor([1, 2]), reduction="mean")
    assert mean.is_floating_point() and mean.tolist() == [1.0, 2.0]
    assert ops.reduce(torch.tensor([1, 2]), reduction="sum").dtype == torch.int64


def test_reduce_rejects_unknown_reduction():
    with pytest.raises(ValueError, match=r"reduction='min'.*'mean', 'sum', 'max', 'none'"):
        ops.reduce(torch.ones(1), reduction="min")


# ------------------------------------------------------------------------------------------ N processes


def _ops_checks() -> dict:
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    last = world - 1
    out: dict = {}

    nested = {
        "f": torch.full((2,), float(rank)),
        "t": (torch.tensor(rank), Pair(torch.tensor([rank % 2 == 0]), torch.tensor([rank], dtype=torch.int16))),
    }
    gathered = ops.gather(nested)
    out["gather_types"] = (type(gathered).__name__, type(gathered["t"]).__name__, type(gathered["t"][1]).__name__)
    out["gather"] = ops.listify(gathered)
    out["gather_dtypes"] = [str(gathered["t"][1].x.dtype), str(gathered["t"][1].y.dtype)]

    uneven = ops.gather({"rows": torch.full((rank + 1, 2), rank, dtype=torch.float64),
                         "maybe_empty": torch.full((rank,), rank, dtype=torch.int16)})
    out["uneven"] = ops.listify(uneven)
    try:
        ops.gather(torch.zeros(2, rank + 1))
        out["mismatch"] = None
    except ops.DistributedOperationException as error:
        out["mismatch"] = str(error)

    out["gather_object"] = ops.gather_object([f"r{rank}"] * (rank + 1))
    out["gather_object_single"] = ops.gather_object({"rank": rank})

    target = {"x": torch.full((3,), float(rank)), "y": [torch.full((2,), rank, dtype=torch.int16)]}
    same_x = target["x"]
    result = ops.broadcast(target)
    out["broadcast_0"] = ops.listify(target)
    out["broadcast_in_place"] = result["x"] is same_x
    strided = torch.full((3, 2), float(rank)).t()  # not contiguous
    ops.broadcast(strided, from_process=last)
    out["broadcast_last"] = strided.tolist()
    objects = [rank, f"s{rank}"]
    out["objects_same_list"] = ops.broadcast_object_list(objects, from_process=last) is objects
    out["objects"] = objects

    value = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
    out["sum"] = ops.reduce(value, reduction="sum").tolist()
    out["mean_scaled"] = ops.reduce({"v": value}, reduction="mean", scale=0.5)["v"].tolist()
    out["int_mean"] = ops.reduce(torch.tensor([rank]), reduction="mean").tolist()
    out["none"] = ops.reduce(value, reduction="none", scale=2.0).tolist()
    out["max"] = ops.reduce(torch.tensor([rank, -rank]), reduction="max", scale=2).tolist()
    out["value_untouched"] = value.tolist()

    ragged = torch.full((rank + 1, 2), rank)
    out["pad"] = ops.pad_across_processes(ragged, pad_index=-1).tolist()
    out["pad_first"] = ops.pad_across_processes([ragged], pad_index=-1, pad_first=True)[0].tolist()
    out["pad_dim1"] = ops.pad_across_processes(torch.full((1, rank + 1), rank), dim=-1).tolist()
    out["pad_then_gather"] = ops.gather(ops.pad_across_processes(ragged, pad_index=-1)).shape[0]
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_on_gloo(world):
    results = run_distributed(_ops_checks, world)
    ranks = range(world)
    last = world - 1
    for rank, out in enumerate(results):
        assert out["gather_types"] == ("dict", "tuple", "Pair")
        assert out["gather"] == {
            "f": [float(r) for r in ranks for _ in range(2)],
            "t": ([r for r in ranks], Pair([r % 2 == 0 for r in ranks], [r for r in ranks])),
        }
        assert out["gather_dtypes"] == ["torch.bool", "torch.int16"]
        assert out["uneven"]["rows"] == [[float(r)] * 2 for r in ranks for _ in range(r + 1)]
        assert out["uneven"]["maybe_empty"] == [r for r in ranks for _ in range(r)]
        assert out["mismatch"] is not None
        for r in ranks:
            assert f"rank {r}: float32[2, {r + 1}]" in out["mismatch"]
        assert out["gather_object"] == [f"r{r}" for r in ranks for _ in range(r + 1)]
        assert out["gather_object_single"] == [{"rank": r} for r in ranks]
        assert out["broadcast_0"] == {"x": [0.0] * 3, "y": [[0, 0]]}
        assert out["broadcast_in_place"] is True
        assert out["broadcast_last"] == [[float(last)] * 3] * 2
        assert out["objects_same_list"] is True and out["objects"] == [last, f"s{last}"]
        total = sum(r + 1 for r in ranks)
        assert out["sum"] == [total, 2.0 * total]
        assert out["mean_scaled"] == pytest.approx([0.5 * total / world, total / world])
        assert out["int_mean"] == pytest.approx([sum(ranks) / world])
        assert out["none"] == [2.0 * (rank + 1), 4.0 * (rank + 1)]
        assert out["max"] == [2 * last, 0]  # the element-wise largest over ranks (Accelerate's "max"), scaled
        assert out["value_untouched"] == [rank + 1.0, 2.0 * (rank + 1)]
        assert out["pad"] == [[rank] * 2] * (rank + 1) + [[-1, -1]] * (world - rank - 1)
        assert out["pad_first"] == [[-1, -1]] * (world - rank - 1) + [[rank] * 2] * (rank + 1)
        assert out["pad_dim1"] == [[rank] * (rank + 1) + [0] * (world - rank - 1)]
        assert out["pad_then_gather"] == world * world
