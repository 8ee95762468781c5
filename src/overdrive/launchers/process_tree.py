"""Ending what a launch leaves behind: the processes it started that escaped torchelastic (a worker's children
in a session of their own), and its log folder once the launcher has ended, however it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from overdrive.launchers.protocol import LAUNCHER_PID_VAR


def stop_descendants(grace_s: float = 5.0) -> list[int]:
    """End every process this launch started that is still running, wherever it went: a worker's children
    in a session of their own escape torchelastic, which stops the workers' process groups. They are found
    by the launcher's pid the workers inherited (``OVERDRIVE_LAUNCHER_PID``): SIGTERM, then after
    ``grace_s`` SIGKILL. Returns the pids it signalled (Linux; elsewhere none are found)."""
    marker = f"{LAUNCHER_PID_VAR}={os.getpid()}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if int(entry.name) != os.getpid() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # ended meanwhile, or another user's
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        alive = [pid for pid in found if _signal(pid, sig)]
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _running(pid)]
        if not alive:
            break
    return found


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_REAPER = """
import os, shutil, sys, time
pid, folder = int(sys.argv[1]), sys.argv[2]
def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
while alive():
    time.sleep(0.2)
shutil.rmtree(folder, ignore_errors=True)
"""


def start_reaper(folder: str) -> None:
    """A tiny process of its own session that deletes ``folder`` once this process has ended, however."""
    subprocess.Popen([sys.executable, "-S", "-c", _REAPER, str(os.getpid()), folder], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

