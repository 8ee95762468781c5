"""``gather_for_metrics`` with ``even_batches=False`` gives what the real Accelerate gives, in every loop shape
where Accelerate's loop runs (tests/scripts/gather_uneven_run.py on both, 2 and 3 processes):

- map-style data: the processes' batches line up only where nothing is repeated, and then both return the
  dataset; where they do not line up, Accelerate's gathers do not match (its loop fails), and overdrive's
  processes with fewer batches join the others' last gathers, so the main process's result is the dataset
  once; a process whose loop ended first warns once that it lacks the others' last steps;
- ``dispatch_batches=True``: every process gets a part of every step, so ``even_batches=False`` has no
  effect (it used to split the steps as undispatched data, and a process left without a batch ended the
  loop with a collective mismatch);
- a stream of unknown length, not dispatched: each process's last batch is padded from the stream's start and
  no count of the padding exists, so both return the repeated samples; overdrive warns once, on the main
  process, that they cannot be dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engines import run_script_both

pytestmark = [pytest.mark.requires("accelerate"), pytest.mark.multiprocess, pytest.mark.slow]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "gather_uneven_run.py")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("processes", [2, 3])
def test_gather_for_metrics_with_uneven_batches_is_accelerates(tmp_path, processes):
    ours, theirs = run_script_both(SCRIPT, tmp_path, processes)
    compared = 0
    for rank, (mine, real) in enumerate(zip(ours, theirs)):
        for shape, (got, sizes) in mine["shapes"].items():
            want, real_sizes = real["shapes"][shape]
            kind, samples = shape.split(",")[0], int(shape.split(",")[1])
            if kind != "dispatch":  # dispatched, overdrive cuts the last step otherwise (the gathers agree)
                assert sizes == real_sizes, (rank, shape)
            if want != "not run":
                assert got == want, (rank, shape, got, want)
                compared += 1
            elif all(sizes):  # Accelerate's loop cannot run: overdrive's gives every sample once on the longest
                # process; a shorter one's loop ends first, with the steps it took part in (and a warning)
                assert got == list(range(samples))[:len(got)], (rank, shape, got)
                assert len(got) == samples or len(sizes[rank]) < len(sizes[0]), (rank, shape, got)
        assert mine["warnings"] == (1 if rank == 0 else 0), (rank, mine["warnings"])
        assert mine["short"] == (0 if rank == 0 else 1) and real["short"] == 0, (rank, mine["short"])
    assert compared >= processes * 40
    for shape, (got, _) in ours[0]["shapes"].items():  # dispatched: the dataset once, in every shape
        if shape.startswith("dispatch,"):
            assert got == list(range(int(shape.split(",")[1]))), (shape, got)
