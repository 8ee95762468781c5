"""``overdrive launch --as_accelerate``: the launcher sets one variable for its workers, and ``import overdrive``
installs the alias when it is set, before the worker entry point runs the script (the launcher cannot name the
alias: it lives in the layer above)."""

from __future__ import annotations

import os
import subprocess
import sys

from overdrive.launchers.launch_plan import Command, LaunchPlan
from overdrive.launchers.protocol import AS_ACCELERATE_VAR
from overdrive.launchers.torchrun import WORKER_ENTRY, torchrun_argv, worker_environ

PROBE = ("import sys, overdrive.launchers.worker, accelerate; "
         "print(accelerate.Accelerator.__module__, 'overdrive' in repr(sys.modules['accelerate']))")


def test_the_workers_of_as_accelerate_get_the_variable_and_the_same_entry_point() -> None:
    plan = LaunchPlan(num_processes=2)
    aliased, plain = Command("train.py", as_accelerate=True), Command("train.py")
    assert worker_environ(plan, aliased)[AS_ACCELERATE_VAR] == "1"
    assert AS_ACCELERATE_VAR not in worker_environ(plan, plain)
    assert torchrun_argv(plan, aliased, "/tmp/x") == torchrun_argv(plan, plain, "/tmp/x")
    assert WORKER_ENTRY in torchrun_argv(plan, aliased, "/tmp/x")


def test_import_overdrive_installs_the_alias_when_the_launcher_asks() -> None:
    env = {**os.environ, AS_ACCELERATE_VAR: "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["overdrive.accelerator.facade", "True"], out.stdout
    # without the variable, ``import accelerate`` is the real package (installed in the test environment)
    env.pop(AS_ACCELERATE_VAR)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0].startswith("accelerate."), out.stdout
