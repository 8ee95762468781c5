"""What Accelerate 1.16's launcher does when a run fails or is stopped, done by ``overdrive launch``: the end of
the failed process's stderr rides on the raised error (bounded as Accelerate bounds it), ``--quiet`` leaves the
launcher's traceback out, and SIGTERM ends every process the run started, even one in a session of its own.
Real processes, started as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import clean_env

pytestmark = pytest.mark.multiprocess

# floods stderr well past the kept tail, then fails (Accelerate 1.16's test_child_stderr_is_written_through...)
FLOOD = "import sys\nfor _ in range(20_000):\n    print('x' * 40, file=sys.stderr)\nraise ValueError('the real cause')\n"
DRIVER = """
import json, subprocess, sys
from overdrive.compat.cli_launch import launch_command, launch_command_parser, simple_launcher
from overdrive.launchers.failure_report import CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS
argv = ["--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", sys.argv[1]]
out = {}
try:
    launch_command(launch_command_parser().parse_args(argv))
except subprocess.CalledProcessError as err:
    out = {"code": err.returncode, "tail": err.stderr, "cause": str(err.__cause__),
           "bound": CHILD_STDERR_CHUNK_SIZE * CHILD_STDERR_TAIL_CHUNKS}
try:
    launch_command(launch_command_parser().parse_args(["--quiet", *argv]))
except SystemExit as err:
    out["quiet_exit"] = err.code
try:  # Accelerate's one-process launcher: the child's own stderr, bounded the same way
    simple_launcher(launch_command_parser().parse_args(argv))
except subprocess.CalledProcessError as err:
    out["simple"] = [err.returncode, err.stderr[-200:], len(err.stderr.encode()), str(err.__cause__)[-200:]]
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.timeout(200)
def test_a_failed_run_carries_its_stderr_tail_and_quiet_exits_plainly(tmp_path):
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    result = subprocess.run([sys.executable, "-c", DRIVER, str(script)], env=clean_env(tmp_path),
                            capture_output=True, text=True, timeout=190)
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, result.stderr[-3000:]
    out = json.loads(line[0][len("RESULT "):])
    assert out["code"] == 1 and "the real cause" in out["tail"] and "the real cause" in out["cause"]
    assert 0 < len(out["tail"].encode()) <= out["bound"]
    assert out["quiet_exit"] == 1
    code, end, size, cause = out["simple"]
    assert code == 1 and "the real cause" in end and "the real cause" in cause and 0 < size <= out["bound"]
    # the workers' stderr still reaches the terminal in full, as it is written
    assert result.stderr.count("x" * 40) >= 3 * 20_000 and len(result.stderr) > out["bound"]


GRANDCHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("READY", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds processes through /proc (Linux)")
@pytest.mark.timeout(150)
def test_sigterm_ends_every_process_the_run_started(tmp_path):
    script, pid_file, out = tmp_path / "tree.py", tmp_path / "grandchild.pid", tmp_path / "out.txt"
    script.write_text(GRANDCHILD)
    with out.open("w") as stdout:
        launcher = subprocess.Popen([sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", "1",
                                     str(script), str(pid_file)], stdout=stdout, stderr=subprocess.PIPE,
                                    env=clean_env(tmp_path), start_new_session=True, text=True)
        grandchild = None
        try:
            deadline = time.monotonic() + 120
            while "READY" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            grandchild = int(pid_file.read_text())
            assert _alive(grandchild)
            launcher.send_signal(signal.SIGTERM)  # the launcher alone, as a job scheduler ends a job
            _, err = launcher.communicate(timeout=60)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err
    deadline = time.monotonic() + 10
    while grandchild is not None and _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    if grandchild is not None and _alive(grandchild):
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the worker's child in its own session outlived the launcher")
