"""A script written for Accelerate gets Accelerate's batches on overdrive: shuffled orders and a resume in the
shape of Accelerate's ``examples/by_feature/checkpointing.py`` (save_state at ``step_5``, load_state, the
starting epoch from ``len(train_dataloader)``, the script skipping the batches it already trained on), run by
tests/scripts/resume_run.py once on the real Accelerate and once on overdrive, on 1 and 2 processes (gloo),
compared batch by batch.

Before overdrive followed Accelerate here, ``load_state`` moved prepared loaders to their saved mid-epoch
position (``len()`` 11 instead of 16 on one process, 3 instead of 8 on two), so the script skipped batches
twice, and one process replaced the loader's own sampler (``g.manual_seed(42)`` ignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engines import run_script, run_script_both

pytestmark = [pytest.mark.requires("accelerate")]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "resume_run.py")


def _compare(ours: list[dict], theirs: list[dict]) -> None:
    processes = len(ours)
    for rank, (mine, real) in enumerate(zip(ours, theirs)):
        assert mine["orders"] == real["orders"], f"rank {rank}: shuffled orders differ from Accelerate's"
        assert mine["stateful"] == real["stateful"], f"rank {rank}: a stateful loader resumes otherwise"
        assert mine["train"]["batches"] == real["train"]["batches"], f"rank {rank}: training batches differ"
        assert mine["train"]["losses"] == pytest.approx(real["train"]["losses"], rel=1e-6, abs=1e-9)
        for skip in ("continue", "skip_first_batches"):
            got, want = mine["resume"][skip], real["resume"][skip]
            # the full length after load_state: the script's starting epoch and skip count depend on it
            assert got["length_after_load"] == want["length_after_load"] == 64 // (4 * processes)
            assert (got["starting_epoch"], got["overall_step"]) == (want["starting_epoch"], want["overall_step"])
            assert got["batches"] == want["batches"], f"rank {rank}, {skip}: resumed batches differ"
            assert got["losses"] == pytest.approx(want["losses"], rel=1e-6, abs=1e-9)
            assert got["weights"] == pytest.approx(want["weights"], rel=1e-6)
            # 3 epochs of 64 / (4 * processes) batches, the first 5 skipped
            assert len(got["batches"]) == 3 * 64 // (4 * processes) - 5


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[dict]:
    """overdrive's one-process run (the two-process test compares its global order with it)."""
    return run_script(SCRIPT, tmp_path_factory.mktemp("one"), 1, True)


def test_one_process_matches_accelerate(one_process, tmp_path):
    _compare(one_process, run_script(SCRIPT, tmp_path, 1, False))
    # one process keeps the DataLoader's own sampler: seeding its generator gives plain PyTorch's order
    assert one_process[0]["orders"]["generator"] == one_process[0]["orders"]["plain"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_accelerate(one_process, tmp_path):
    ours, theirs = run_script_both(SCRIPT, tmp_path, 2)
    _compare(ours, theirs)
    # with the generator seeded before each epoch (Accelerate's training_check), two processes see, step by
    # step, what one process sees: its batches in turn, rank 0's then rank 1's
    for epoch, single in enumerate(one_process[0]["orders"]["generator"]):
        steps = zip(ours[0]["orders"]["generator"][epoch], ours[1]["orders"]["generator"][epoch])
        assert [batch for pair in steps for batch in pair] == single
