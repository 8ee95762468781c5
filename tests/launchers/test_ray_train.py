"""Ray Train's ``TorchTrainer`` for real, on 2 CPU workers: an Accelerate-style overdrive loop inside
``train_loop_per_worker`` (tests/scripts/ray_train_job.py) adopts the process group Ray Train made and
trains as one process would; then, in the same Ray instance (Ray's start dominates the time), a run whose rank 1
hangs ends at the process-group timeout with overdrive's hang report (the watchdog runs on Ray's group). Needs
``ray[train]`` (the test extra has it; also the ``ray`` extra).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.cli import SCRIPTS, clean_env
from tests.support.toy import reference_weights

HANG_TIMEOUT_S = 15  # the hang run's process-group timeout (Ray's default: 1800 s)
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.requires("ray")]  # overdrive[ray]

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (the driver's: it and every process Ray started that stayed in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[4]) == sid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


@pytest.mark.timeout(480)
def test_an_overdrive_loop_in_ray_trains_torchtrainer_adopts_its_group_equals_one_process_and_reports_a_hang(
        tmp_path):
    steps = 6
    # the repository root too: Ray's workers import the job's data and model from tests/support/toy.py
    env = clean_env(tmp_path, PYTHONPATH=os.pathsep.join((str(SRC), str(ROOT), os.environ.get("PYTHONPATH", ""))),
                    RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_V2_ENABLED="1",
                    RAY_DEDUP_LOGS="0")  # the report's lines as printed, not merged across workers
    started = time.monotonic()
    with open(tmp_path / "ray.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, str(SCRIPTS / "ray_train_job.py"), str(tmp_path), "--steps",
                                   str(steps), "--hang_timeout", str(HANG_TIMEOUT_S)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        driver.wait(timeout=420)
    finally:  # Ray's processes (raylet, GCS, workers) end with ray.shutdown(); whatever is left is killed
        for _ in range(50):
            left = _session_pids(driver.pid)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        driver.wait(timeout=10)
    print(f"Ray Train runs (Ray start, 2 workers, {steps} steps; the hang run; shutdown): "
          f"{time.monotonic() - started:.1f} s")
    output = (tmp_path / "ray.log").read_text(errors="replace")
    assert driver.returncode == 0 and "RAY TRAIN DONE" in output, output[-6000:]
    result = json.loads((tmp_path / "ray_result.json").read_text())
    for rank, seen in enumerate(result["workers"]):
        # overdrive's view of each worker is Ray's, and the group is the one Ray Train made (adopted, not remade)
        assert seen["rank"] == seen["ray_rank"] == rank and seen["world"] == seen["ray_world"] == 2, seen
        assert seen["local_rank"] == seen["ray_local_rank"], seen
        assert seen["made_by_ray"] and seen["same_group"], seen
        assert seen["device"] == "cpu" and seen["model"] == "DistributedDataParallel", seen
    want_weights, want_losses = reference_weights(steps)
    assert result["losses"] == pytest.approx(want_losses, rel=0, abs=1e-6)
    got = torch.load(tmp_path / "weights.pt")
    for name, want in want_weights.items():
        torch.testing.assert_close(got[name], want, rtol=0, atol=1e-6)
    _check_the_hang_run(tmp_path, output)


def _check_the_hang_run(out: Path, log: str) -> None:
    """The second run: rank 1 slept before step 2's backward while rank 0 waited in DDP's all-reduce."""
    assert "RAY TRAIN HANG RUN DONE" in log, log[-6000:]
    hang = json.loads((out / "hang_result.json").read_text())
    error = hang["error"] or ""
    # fit() raised the workers' failure, and the error Ray Train reports carries the report's first lines
    assert hang["error_type"] in ("WorkerGroupError", "TrainingFailedError"), hang
    headline = f"overdrive: hang detected: rank 0 waited {HANG_TIMEOUT_S} s in collective #"
    assert headline in error and "(gloo:all_reduce) and timed out; rank 1 did not arrive." in error, error[-4000:]
    assert "TorchConfig(timeout_s=...)" in error and "the hang report on rank 0's stderr" in error, error[-4000:]
    # the whole report, with rank 1's stack, on rank 0's stderr, which Ray forwards to the driver
    assert log.count("overdrive-hang-report: ") == 1, log[-6000:]  # once (Ray Train's print() logs twice)
    report = log[log.index("overdrive: hang detected"):]
    assert "<- did not arrive" in report.split("-- rank 1:")[1].splitlines()[0], report[:4000]
    assert "time.sleep(300)" in report.split("-- rank 1:")[1].split("-- rank 0:")[0], report[:4000]
    assert "accelerator.backward(loss)" in report.split("-- rank 0:")[1], report[:4000]
    # the run ended at the timeout, not at Ray's 1800 s: the report and Ray's shutdown of the workers after it
    took = hang["ended"] - hang["hang_at"]
    print(f"the hang run ended {took:.1f} s after rank 1 began to hang (timeout {HANG_TIMEOUT_S} s)")
    assert HANG_TIMEOUT_S - 1 < took < HANG_TIMEOUT_S + 60, took
