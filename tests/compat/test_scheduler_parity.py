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

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import clean_env

pytestmark = [pytest.mark.requires("accelerate")]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "scheduler_lrs.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _run(folder: Path, processes: int, overdrive: bool) -> list[dict]:
    """Each rank's learning rates from the script: overdrive (``--alias`` on one process, ``overdrive launch
    --as_accelerate`` on several) or the real Accelerate (plain python / torchrun)."""
    out = folder / ("overdrive" if overdrive else "accelerate")
    env = {k: v for k, v in clean_env(folder, PYTHONPATH=SRC).items() if not k.startswith("ACCELERATE_")}
    if processes == 1:
        command = [sys.executable, SCRIPT, str(out), *(["--alias"] if overdrive else [])]
    elif overdrive:
        command = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                   "--as_accelerate", SCRIPT, str(out)]
    else:  # Accelerate runs several CPU processes only when told to use the CPU
        env["ACCELERATE_USE_CPU"] = "true"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), SCRIPT,
                   str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    results = [json.loads((out / f"result_{rank}.json").read_text()) for rank in range(processes)]
    assert [r.pop("library") for r in results] == ["overdrive" if overdrive else "accelerate"] * processes
    return results


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
    _compare(_run(tmp_path, 1, True), _run(tmp_path, 1, False))


@pytest.mark.slow
def test_two_processes_lrs_match_accelerate(tmp_path):
    theirs = _run(tmp_path, 2, False)
    # each optimizer step moves the schedule once per process (lr_lambda 1 / (1 + n): 1/3 after the first)
    assert theirs[0]["lambda"][0] == pytest.approx(1 / 3) and theirs[0]["lambda_split"][0] == pytest.approx(1 / 2)
    _compare(_run(tmp_path, 2, True), theirs)
