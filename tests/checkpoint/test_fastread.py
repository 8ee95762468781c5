"""Tensors read straight into their targets (checkpoint/fastread.py) equal DCP's own reads, and what the fast
path cannot take (views, transposes, another dtype) still goes through DCP and comes back right."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from overdrive.checkpoint import fastread
from overdrive.checkpoint.storage import SafeFileSystemReader, SafeLoadPlanner


def saved_state() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=g)
    return {
        "weight": torch.randn(64, 32, generator=g),
        "bf16": torch.randn(16, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "transposed": base.t(),  # saved as a view with strides (1, 4): not a contiguous storage
        "row": base[2],  # a view into a larger storage (DCP writes its elements only)
        "step": 7,
    }


def test_in_place_reads_equal_the_saved_tensors_and_the_rest_goes_through_dcp(tmp_path, monkeypatch):
    state = saved_state()
    dcp.save(state, checkpoint_id=tmp_path, no_dist=True)
    targets = {k: (torch.zeros_like(v).contiguous() if isinstance(v, torch.Tensor) else 0) for k, v in state.items()}
    weight_memory = targets["weight"].data_ptr()
    fast: list[str] = []
    original = fastread.read_in_place

    def counting(file, offset, length, request, planner):  # which items took the fast path
        done = original(file, offset, length, request, planner)
        if done:
            fast.append(request.dest_index.fqn)
        return done

    monkeypatch.setattr(fastread, "read_in_place", counting)
    dcp.load(targets, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner(), no_dist=True)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert targets[key].dtype == value.dtype and torch.equal(targets[key], value), key
        else:
            assert targets[key] == value
    assert targets["weight"].data_ptr() == weight_memory  # filled in place, not replaced
    assert set(fast) >= {"weight", "bf16", "scalar"}
    assert not {"transposed", "step"} & set(fast)


def test_an_in_place_read_bumps_the_version_counter_as_copy_does(tmp_path):
    """Autograd must see that a loaded tensor changed (as it does for ``copy_``)."""
    dcp.save({"w": torch.ones(8)}, checkpoint_id=tmp_path, no_dist=True)
    target = {"w": torch.zeros(8)}
    before = target["w"]._version
    dcp.load(target, storage_reader=SafeFileSystemReader(tmp_path), planner=SafeLoadPlanner(), no_dist=True)
    assert torch.equal(target["w"], torch.ones(8)) and target["w"]._version > before
