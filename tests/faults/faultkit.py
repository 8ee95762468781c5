"""Helpers of the fault-injection suite: a clean environment, the CLI as a subprocess, free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
if str(TESTS) not in sys.path:  # tests/distributed.py
    sys.path.insert(0, str(TESTS))

_CLUSTER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "GROUP_RANK", "TORCHELASTIC",
                     "OMPI_", "PMI_", "SLURM_", "MV2_", "OVERDRIVE_", "ACCELERATE_")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without any cluster's variables; config files looked up under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLUSTER_PREFIXES)}
    env.update(OVERDRIVE_CONFIG_FILE=str(tmp_path / "default_config.yaml"), HF_HOME=str(tmp_path / "hf"),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    env.update(extra)
    return env


def overdrive(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 60,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    """``overdrive ARGS`` run as a user would; a hard ``timeout``."""
    return subprocess.run([sys.executable, "-m", "overdrive.cli", *args], env=env, cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
