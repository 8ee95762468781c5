"""Tensors read straight into their targets (checkpoint/fastread.py) equal DCP's own reads, and what the fast
path cannot take (views, transposes, another dtype) still goes through DCP and comes back right."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from overdrive.checkpoint import fastread
from overdrive.checkpoint.storage import SafeFileSystemReader, SafeLoadPlanner, checksum
from overdrive.checkpoint.writer import ChecksummingWriter


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


@pytest.mark.parametrize("writer", ["dcp", "overdrive"])
def test_in_place_reads_equal_the_saved_tensors_and_the_rest_goes_through_dcp(tmp_path, monkeypatch, writer):
    """Files of DCP's own writer and of overdrive's (archives without per-record CRCs) alike."""
    state = saved_state()
    if writer == "dcp":
        dcp.save(state, checkpoint_id=tmp_path, no_dist=True)
    else:
        dcp.save(state, storage_writer=ChecksummingWriter(tmp_path, 2), no_dist=True)
    targets: dict[str, Any] = {k: (torch.zeros_like(v).contiguous() if isinstance(v, torch.Tensor) else 0) for k, v in state.items()}
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


def test_the_writer_records_each_file_as_written_and_torch_load_reads_its_archives(tmp_path):
    """The size and CRC-32 computed on the way out are those of the finished file; DCP's own reader (torch.load
    on every item, no in-place reads) gets back what was saved."""
    state = saved_state()
    writer = ChecksummingWriter(tmp_path, 2)
    metadata = dcp.save(state, storage_writer=writer, no_dist=True)
    names = {info.relative_path for info in metadata.storage_data.values()}
    assert set(writer.checksums) == names and len(names) == 2
    for name, entry in writer.checksums.items():
        assert entry == {"size": (tmp_path / name).stat().st_size, "crc32": checksum(tmp_path / name)}
    targets: dict[str, Any] = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0) for k, v in state.items()}
    dcp.load(targets, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    for key, value in state.items():
        assert torch.equal(targets[key], value) if isinstance(value, torch.Tensor) else targets[key] == value, key


def test_an_archive_whose_write_fails_is_closed_and_does_not_abort_the_process_later(tmp_path):
    """A failed write (a full disk) inside a tensor's archive raises; the half-written archive must be closed
    then, or its destructor writes the end of the archive into the failed stream later (at garbage
    collection) and the C++ exception aborts the process."""
    import subprocess
    import sys

    script = tmp_path / "fail.py"
    script.write_text("""
import gc, torch
from overdrive.checkpoint.writer import save_tensor

class Full:
    def write(self, data):
        raise OSError(28, "No space left on device")

try:
    save_tensor(torch.ones(1000), Full())
except OSError as exc:
    caught = exc
del caught
gc.collect()
print("survived")
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-2000:]
