"""Fault output that leads with what matters: a worker's traceback starts at the user's code (no launcher
frames), Ctrl-C ends the job with one line. (That a warning the user cannot act on is not printed by every rank
is checked on the README's tensor-parallel run itself: tests/test_readme.py.)
Real processes, started by ``overdrive launch`` as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import clean_env, overdrive

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(150)
def test_a_worker_traceback_starts_at_the_users_code(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("from overdrive import Accelerator\naccelerator = Accelerator()\n\n"
                      "def step():\n    raise ValueError(f'bad batch on rank {accelerator.process_index}')\n\n"
                      "step()\n")
    result = overdrive("launch", "--cpu", "--num_processes", "2", str(script), env=clean_env(tmp_path), timeout=140)
    assert result.returncode == 1, result.stderr
    first = result.stderr.split("Traceback (most recent call last):\n", 1)[1].splitlines()[0]
    assert first.endswith(f'File "{script}", line 7, in <module>'), result.stderr
    assert "worker.py" not in result.stderr and "runpy" not in result.stderr
    assert "ValueError: bad batch on rank 0" in result.stderr


@pytest.mark.timeout(150)
def test_ctrl_c_ends_the_job_with_one_line(tmp_path):
    script = tmp_path / "long.py"
    script.write_text("import time\nfrom overdrive import Accelerator\nAccelerator()\nprint('READY', flush=True)\n"
                      "time.sleep(300)\n")
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        # its own process group, as a shell's foreground job: Ctrl-C sends SIGINT to that group
        launcher = subprocess.Popen([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "2",
                                     str(script)], stdout=stdout, stderr=stderr, env=clean_env(tmp_path),
                                    start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while out.read_text().count("READY") < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert out.read_text().count("READY") == 2, err.read_text()
            os.killpg(launcher.pid, signal.SIGINT)
            code = launcher.wait(timeout=60)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGINT
    assert err.read_text().splitlines() == ["overdrive launch: starting 2 CPU processes on gloo (no GPU found)",
                                            "overdrive launch: stopped by SIGINT; the workers were stopped"]


def test_the_hang_report_leads_with_the_rank_the_collective_and_what_to_do():
    import traceback

    from overdrive.runtime import hang_report
    from overdrive.runtime.watchdog import _format

    last = {"name": "gloo:all_reduce", "seq": 8}
    answers = {0: {"seq": 8, "last": last, "stack": "  thread MainThread:\n    waiting"},
               1: {"seq": 7, "last": {"name": "gloo:all_reduce", "seq": 7}, "stack": "  thread MainThread:\n    asleep"}}
    report = hang_report.hang(0, 8.0, {"seq": 8, "last": last}, answers, {0: 8, 1: 7}, {})
    lines = report["text"].splitlines()
    assert lines[0] == ("overdrive: hang detected: rank 0 waited 8 s in collective #8 (gloo:all_reduce) and timed "
                        "out; rank 1 did not arrive.")
    assert lines[1].startswith("overdrive: what to do: see below where rank 1 is instead of in gloo:all_reduce")
    assert "--timeout SECONDS" in lines[1]
    assert report["text"].index("-- rank 1:") < report["text"].index("-- rank 0:")  # the hung rank's stack first
    frames = traceback.StackSummary.from_list(
        [("/work/train.py", 3, "<module>", "loss.backward()")]
        + [(f"/venv/site-packages/torch/autograd/m{i}.py", i, "f", "x") for i in range(4)])
    text = _format(frames)
    assert "train.py" in text and "torch/autograd/m0.py" in text and "m1.py" not in text
    assert "... 3 more frames inside torch" in text


@pytest.mark.timeout(150)
def test_stdout_and_stderr_keep_the_workers_order_when_piped_together(tmp_path):
    """A progress line on stderr and a result printed on stdout right after it (the demo's last progress line
    and its accuracy) reach a pipe that takes both (``2>&1 | ...``) in the order the worker wrote them; stderr
    alone still goes to stderr and stdout to stdout."""
    script = tmp_path / "order.py"
    script.write_text("import sys\nimport os\nif os.environ['RANK'] == '0':\n    for i in range(6):\n"
                      "        sys.stderr.write(f'progress {i}\\n')\n        print(f'result {i}')\n"
                      "    sys.stdout.write('tail without newline')\n")
    env = clean_env(tmp_path)
    merged = subprocess.run([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "2",
                             str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=140)
    assert merged.returncode == 0, merged.stdout
    lines = [line for line in merged.stdout.splitlines() if line.startswith(("progress", "result"))]
    assert lines == [f"{kind} {i}" for i in range(6) for kind in ("progress", "result")], merged.stdout
    assert merged.stdout.rstrip().endswith("tail without newline"), merged.stdout
    apart = subprocess.run([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "2",
                            str(script)], env=env, capture_output=True, text=True, timeout=140)
    assert [line for line in apart.stdout.splitlines() if line.startswith("result")] == \
        [f"result {i}" for i in range(6)], apart.stdout
    assert "progress" not in apart.stdout and "result" not in apart.stderr
    assert [line for line in apart.stderr.splitlines() if line.startswith("progress")] == \
        [f"progress {i}" for i in range(6)], apart.stderr


_HANDOVER = ("import faulthandler, os, subprocess, sys\n"
             "if os.environ['RANK'] == '0':\n"
             "    print('before child')\n"
             "    subprocess.run([sys.executable, '-c', 'print(\"from child\")'], stdout=sys.stdout, check=True)\n"
             "    print('after child')\n"
             "    faulthandler.enable(sys.stdout)\n"
             "    faulthandler.dump_traceback(sys.stdout)  # what a fault writes, without ending the run\n"
             "    print('after dump')\n")


def _handover(tmp_path) -> tuple[list[str], list[str], str]:
    """The launcher's stdout lines (stripped) of a 2-process run of _HANDOVER, the lines that came from it in
    the order they arrived, and the launcher's stderr."""
    script = tmp_path / "handover.py"
    script.write_text(_HANDOVER)
    result = subprocess.run([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "2",
                             str(script)], env=clean_env(tmp_path), capture_output=True, text=True, timeout=140)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    dump = [line for line in lines if line.startswith("Current thread")]
    frame = f'File "{script}", line 7 in <module>'
    assert len(dump) == 1 and frame in lines, result.stdout
    mine = ("before child", "from child", "after child", dump[0], frame, "after dump")
    return lines, [line for line in lines if line in mine], result.stderr


@pytest.mark.timeout(150)
def test_a_worker_can_hand_its_stdout_to_a_child_process_and_to_faulthandler(tmp_path):
    """The worker's ``sys.stdout`` is framed into its stderr file (launchers/relay.py); code that asks it for its
    descriptor still works: a child process given ``stdout=sys.stdout`` and ``faulthandler.enable(sys.stdout)``
    write to the launcher's stdout (nothing of theirs on stderr), and the worker's own prints keep their order."""
    lines, arrived, stderr = _handover(tmp_path)
    assert len(arrived) == 6, lines  # each line once: the child's, the dump's two and the three prints
    assert [line for line in arrived if line in ("before child", "after child", "after dump")] == \
        ["before child", "after child", "after dump"], lines
    assert arrived.index(next(line for line in arrived if line.startswith("Current thread"))) \
        < arrived.index(next(line for line in arrived if line.startswith("File"))), lines  # the dump as written
    assert not any(word in stderr for word in ("child", "after dump", "most recent call")), stderr
