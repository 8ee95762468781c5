"""Ray Train's ``TorchTrainer`` for real, on 2 CPU workers: an Accelerate-style overdrive loop inside
``train_loop_per_worker`` (tests/scripts/ray_train_job.py) adopts the process group Ray Train made and
trains as one process would. Needs ``ray[train]`` (the test extra has it; also the ``ray`` extra).
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


@pytest.mark.timeout(300)
def test_an_overdrive_loop_in_ray_trains_torchtrainer_adopts_its_group_and_equals_one_process(tmp_path):
    steps = 6
    # the repository root too: Ray's workers import the job's data and model from tests/support/toy.py
    env = clean_env(tmp_path, PYTHONPATH=os.pathsep.join((str(SRC), str(ROOT), os.environ.get("PYTHONPATH", ""))),
                    RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_V2_ENABLED="1")
    started = time.monotonic()
    with open(tmp_path / "ray.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, str(SCRIPTS / "ray_train_job.py"), str(tmp_path), "--steps",
                                   str(steps)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        driver.wait(timeout=240)
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
    print(f"Ray Train run (Ray start, 2 workers, {steps} steps, shutdown): {time.monotonic() - started:.1f} s")
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
