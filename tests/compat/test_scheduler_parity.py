"""A prepared LR scheduler gives Accelerate's learning rates: tests/scripts/scheduler_lrs.py run once on the real
Accelerate and once on overdrive (1 process; 2 gloo processes), compared step by step, for LambdaLR and OneCycleLR
with and without ``split_batches`` / ``step_scheduler_with_optimizer``, under gradient accumulation, and with
steps the optimizer reports skipped (``optimizer._is_overflow``, which Accelerate's ``step_was_skipped`` reads).

Before overdrive followed Accelerate here, a step whose optimizer had ``_is_overflow`` set still stepped the
scheduler (lr 0.8 where Accelerate keeps 0.9: Accelerate's tests/test_scheduler.py), and under accumulation
the scheduler's step counter moved with ``adjust_scheduler`` so a OneCycleLR stopped early (Accelerate's
``GradientState`` drops the plugin's default ``adjust_scheduler=True``: the counter never moves there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engines import run_script_both

pytestmark = [pytest.mark.requires("accelerate")]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "scheduler_lrs.py")


def _compare(ours: list[dict], theirs: list[dict]) -> None:
    for rank, (mine, real) in enumerate(zip(ours, theirs)):
        assert mine.keys() == real.keys()
        for setting in real:
            assert mine[setting] == pytest.approx(real[setting], rel=1e-12, abs=0), f"rank {rank}: {setting}"
    # the settings really differ from each other (a scheduler that never stepped would match nothing here)
    lrs = theirs[0]
    assert lrs["lambda"] != lrs["lambda_skipped"] != lrs["lambda_accumulate"]
    assert lrs["one_cycle"] != lrs["one_cycle_accumulate"]


def test_one_process_lrs_match_accelerate(tmp_path):
    _compare(*run_script_both(SCRIPT, tmp_path, 1))


@pytest.mark.slow
def test_two_processes_lrs_match_accelerate(tmp_path):
    ours, theirs = run_script_both(SCRIPT, tmp_path, 2)
    # each optimizer step moves the schedule once per process (lr_lambda 1 / (1 + n): 1/3 after the first)
    assert theirs[0]["lambda"][0] == pytest.approx(1 / 3) and theirs[0]["lambda_split"][0] == pytest.approx(1 / 2)
    _compare(ours, theirs)
