"""Running the ``overdrive`` command as a user would, from tests: a clean environment (no cluster's variables,
config files under the test's folder), the command with a hard timeout, independent commands at the same time
(``run_at_once``), and the per-rank results a launched test script (tests/scripts/) wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.no_shm_op.sitecustomize import FOLDER as NO_SHM_OP

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"  # tests/scripts
# a cluster's variables, and overdrive's / Accelerate's own: a test sets those it means through ``extra``
_CLUSTER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_",
                     "TORCHELASTIC", "SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "MV2_", "PALS_", "OVERDRIVE_",
                     "ACCELERATE_")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without any cluster's (or overdrive's, or Accelerate's) variables, with config files
    looked up under tmp_path; ``extra`` is set last. A ``PYTHONPATH`` given keeps the folder that keeps
    DeepSpeed's shared-memory op off (tests/conftest.py), when this process has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLUSTER_PREFIXES)}
    env.update(OVERDRIVE_CONFIG_FILE=str(tmp_path / "default_config.yaml"), HF_HOME=str(tmp_path / "hf"),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    given = env.get("PYTHONPATH", "").split(os.pathsep)
    if NO_SHM_OP in os.environ.get("PYTHONPATH", "").split(os.pathsep) and NO_SHM_OP not in given:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (*given, NO_SHM_OP)))
    return env


def overdrive(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 60,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    """``overdrive ARGS`` run as a user would (``python -m overdrive.cli``), with a hard ``timeout``."""
    return subprocess.run([sys.executable, "-m", "overdrive.cli", *args], env=env, cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def run_at_once(*commands: tuple[list[str], dict[str, str], Path | None],
                timeout: float) -> list[subprocess.CompletedProcess]:
    """Independent ``(argv, env, cwd)`` commands started together and waited for together: what each would
    give alone, in their order. A command spends most of its time starting Python with big libraries, so
    one started beside another uses a core the test would leave idle while it waits. Outputs go through
    files (a full pipe would stall a command until the ones before it ended); past ``timeout`` every command's
    process group is killed and ``subprocess.TimeoutExpired`` raised."""
    with tempfile.TemporaryDirectory() as folder:
        started = []
        for i, (argv, env, cwd) in enumerate(commands):
            with open(Path(folder) / f"{i}.out", "wb") as out, open(Path(folder) / f"{i}.err", "wb") as err:
                started.append(subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err,
                                                stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout
        try:
            for proc in started:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for proc in started:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        return [subprocess.CompletedProcess(argv, proc.returncode,
                                            (Path(folder) / f"{i}.out").read_text(errors="replace"),
                                            (Path(folder) / f"{i}.err").read_text(errors="replace"))
                for i, ((argv, _, _), proc) in enumerate(zip(commands, started))]


def rank_results(result: subprocess.CompletedProcess, folder: Path, world: int = 2) -> list[dict[str, Any]]:
    """What each rank of a launched test script wrote to ``folder/result_<rank>.json``, in rank order, after
    checking that the launch succeeded and that every rank wrote its file."""
    assert result.returncode == 0, result.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("result_*.json"))]
    assert sorted(r["rank"] for r in results) == list(range(world)), result.stdout
    return results
