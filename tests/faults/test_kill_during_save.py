"""``kill -9`` of a process at random moments while it saves, over and over, into one checkpoint folder:
the last good checkpoint must always load (slow mode: 20 trials; the fast suite runs 2). Every other
trial saves with ``async_save=True``, so the kill lands in a background write."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from overdrive import Accelerator
from overdrive.training.state import GradientState
from tests.faults.faultkit import SCRIPTS, clean_env


def _load(folder: Path) -> int:
    """Load ``folder`` into a fresh run like the saver's; return the step it holds."""
    GradientState._reset_state()
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
    optimizer = torch.optim.AdamW(model.parameters())
    accelerator.prepare(model, optimizer)
    accelerator.load_state(folder)
    assert optimizer.state, "the optimizer state was not restored"
    return accelerator.step


def _trial(tmp_path: Path, rng: random.Random, env: dict, async_save: bool) -> tuple[int, int]:
    folder = tmp_path / "ckpt"
    extra = ["--async"] if async_save else []
    saver = subprocess.Popen([sys.executable, "-u", str(SCRIPTS / "save_forever.py"), str(folder), *extra], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = saver.stdout.readline()  # one checkpoint published: from here on one must always load
        assert first.startswith("SAVED"), first
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the next saves: writing, renaming, deleting
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
        announced = [int(line.split()[1]) for line in [first, *saver.stdout.read().splitlines()]
                     if line.startswith("SAVED")]
    finally:
        if saver.poll() is None:
            saver.kill()
    loaded = _load(folder)
    # the checkpoint holds the last announced save, or the one after it (published, not yet announced)
    assert loaded in (announced[-1], announced[-1] + 1), (loaded, announced)
    return loaded, len(announced)


def _trials(tmp_path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    env = clean_env(tmp_path)
    for i in range(count):
        trial = tmp_path / f"trial{i}"
        trial.mkdir()
        if i:  # every later trial starts from the folder the previous kill left
            os.replace(tmp_path / f"trial{i - 1}" / "ckpt", trial / "ckpt")
        _trial(trial, rng, env, async_save=i % 2 == 1)  # every other trial kills a background write


@pytest.mark.timeout(240)
def test_kill_9_during_saves_leaves_a_loadable_checkpoint(tmp_path):
    _trials(tmp_path, 2, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill_9_during_saves_20_random_trials(tmp_path):
    _trials(tmp_path, 20, seed=20)
