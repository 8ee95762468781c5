"""Launcher and process faults: a hung rank, a launcher killed outright, impossible ranks.

Real processes on gloo over 127.0.0.1, started by ``overdrive launch`` as a user would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overdrive.runtime.cluster import detect_process_info
from tests.faults.faultkit import SCRIPTS, clean_env, overdrive

TIMEOUT_S = 8
pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(120)
def test_hung_rank_is_named_with_every_stack_within_the_timeout(tmp_path):
    started = time.time()
    result = overdrive("launch", "--cpu", "--num_processes", "2", "--timeout", str(TIMEOUT_S),
                       str(SCRIPTS / "hang.py"), env=clean_env(tmp_path), timeout=110)
    ended = time.time()
    out, err = result.stdout, result.stderr
    assert result.returncode != 0, err
    hung_at = float(next(line.split()[1] for line in out.splitlines() if line.startswith("HANG_AT")))
    assert started < hung_at < ended
    assert ended - hung_at < TIMEOUT_S + 15, f"the job ended {ended - hung_at:.1f} s after the hang"
    # the worker's report: the collective, its sequence number, the rank that did not arrive, both stacks
    assert "overdrive: hang detected: rank 0 waited 8 s in collective #" in err
    # the report leads: before it only the error's own line, no traceback (its stack is in the report)
    assert "Traceback" not in err.split("overdrive: hang detected")[0], err
    assert err.split("overdrive: hang detected")[1].splitlines()[1].startswith("overdrive: what to do:")
    assert "(gloo:all_reduce) and timed out; rank 1 did not arrive." in err
    assert "<- did not arrive" in err.split("-- rank 1:")[1].splitlines()[0]
    rank1_stack = err.split("-- rank 1:")[1].split("overdrive-hang-report")[0]
    assert "time.sleep(600)" in rank1_stack  # where the hung rank is
    rank0_stack = err.split("-- rank 0:")[1].split("-- rank 1:")[0]
    assert "accelerator.backward(loss)" in rank0_stack  # where the waiting rank waits
    # the launcher's summary blames the hung rank, not the one that timed out waiting
    summary = err[err.index("overdrive launch: rank"):]
    assert summary.startswith("overdrive launch: rank 1 hung: it did not arrive at collective #")
    assert "rank 0: timed out waiting" in summary and "rank 1: hung" in summary
    assert "finished" not in out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.timeout(120)
def test_kill_9_of_the_launcher_ends_the_workers_and_removes_its_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(tmp_path)
    launcher = subprocess.Popen([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "2",
                                 str(SCRIPTS / "forever.py"), str(work)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert _wait_for(lambda: len(list(work.glob("pid_*"))) == 2, 90), "the workers did not start"
        pids = [int(p.read_text()) for p in work.glob("pid_*")]
        folders = list(tmp_path.glob("overdrive-launch-*"))
        assert len(folders) == 1 and all(_alive(pid) for pid in pids)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        assert _wait_for(lambda: not any(_alive(pid) for pid in pids), 10), "workers outlived the launcher"
        assert _wait_for(lambda: not folders[0].exists(), 10), "the launcher's temporary folder is left"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid_file in work.glob("pid_*"):
            pid = int(pid_file.read_text())
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "5", "WORLD_SIZE": "2"}, "rank 5 is outside the world of 2 processes; ranks run 0..1"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "rank -1 is outside the world of 2 processes"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "the world size is 0; it must be at least 1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "local rank 3 is outside"),
])
def test_impossible_ranks_are_refused_at_once(env, message):
    with pytest.raises(ValueError, match="impossible") as caught:
        detect_process_info(env)
    assert message in str(caught.value)


@pytest.mark.timeout(60)
def test_out_of_range_rank_stops_the_accelerator_before_any_rendezvous(tmp_path):
    env = clean_env(tmp_path, RANK="5", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", "from overdrive import Accelerator; Accelerator()"], env=env,
                            capture_output=True, text=True, timeout=50)
    assert result.returncode != 0
    assert "rank 5 is outside the world of 2 processes" in result.stderr
    assert time.monotonic() - started < 30  # not a 15-minute wait for rank 5 to connect


def test_a_launched_worker_runs_the_script_as_python_would(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(f"import sys\nprint(__name__, sys.argv, sys.path[0] == {str(tmp_path)!r})\n")
    from overdrive.launchers.worker import main

    result = subprocess.run([sys.executable, "-m", "overdrive.launchers.worker", "script", str(script), "a", "-b"],
                            capture_output=True, text=True, timeout=30, cwd=Path(__file__).parent)
    assert result.stdout.strip() == f"__main__ {[str(script), 'a', '-b']} True", result.stderr
    assert callable(main)


def _timeouts() -> dict:
    from datetime import timedelta

    from overdrive import Accelerator, InitProcessGroupKwargs
    from overdrive.runtime import watchdog

    Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=7))])
    import torch

    backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return {"watchdog": watchdog.active().timeout.total_seconds(), "group": backend.options._timeout.total_seconds()}


def test_init_process_group_kwargs_timeout_reaches_the_group_and_the_watchdog():
    from overdrive.runtime.process_group import default_timeout
    from tests.support.distributed import run_distributed

    for out in run_distributed(_timeouts, 2, timeout=90):
        assert out == {"watchdog": 7.0, "group": 7.0}
    import torch

    assert default_timeout(torch.device("cpu")).total_seconds() == 180  # far below torch's 10 minutes


@pytest.mark.timeout(150)
def test_a_stall_outside_collectives_is_reported_with_every_stack(tmp_path):
    # every rank sleeps in Python after a barrier: no collective waits, so no timeout can fire; before
    # --stall_timeout the job ran until the outer timeout
    work = tmp_path / "work"
    work.mkdir()
    started = time.time()
    result = overdrive("launch", "--cpu", "--num_processes", "2", "--stall_timeout", "5", str(SCRIPTS / "forever.py"),
                       str(work), env=clean_env(tmp_path), timeout=140)
    ended = time.time()
    err = result.stderr
    assert result.returncode != 0, err
    pids = sorted(int(p.read_text()) for p in work.glob("pid_*"))
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    assert "overdrive: stall detected: no rank issued a collective for 5 s (--stall_timeout)" in err, err
    for rank in (0, 1):
        stack = err.split(f"-- rank {rank} on ")[1].split("-- rank")[0]
        assert "time.sleep(0.1)" in stack and "forever.py" in stack  # where each rank waits
    assert "overdrive launch: the job stalled: no rank issued a collective for 5 s" in err
    files_at = min(p.stat().st_mtime for p in work.glob("pid_*"))
    assert ended - files_at < 5 + 20, f"reported {ended - files_at:.1f} s after the ranks started waiting"
    assert started < files_at
