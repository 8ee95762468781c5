"""The bundled example trains to the same held-out accuracy on one process and on two."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.support.distributed import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # trains the example on 1 and 2 processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def accuracy(command: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.findall(r"held-out accuracy: ([0-9.]+) on (\d+) samples", result.stdout)
    assert len(found) == 1, result.stdout[-2000:]  # printed once, by the main process
    assert found[0][1] == "450"  # every test sample counted exactly once
    return float(found[0][0])


@pytest.mark.timeout(300)
def test_digits_two_processes_match_one():
    args = ["examples/digits.py", "--epochs", "8"]
    one = accuracy([sys.executable, *args, "--batch-size", "64"])
    launcher = str(pathlib.Path(sys.executable).with_name("overdrive"))  # the console script, as a user types it
    two = accuracy([launcher, "launch", "--num_processes", "2", "--main_process_port", str(free_port()), *args,
                    "--batch-size", "32"])
    assert one > 0.93 and two > 0.93, (one, two)
    assert abs(one - two) <= 0.02, (one, two)
