"""One-time C++ builds for the tests (DeepSpeed's ops), and no build lock left behind by a killed test.

DeepSpeed compiles its op ``deepspeed_shm_comm`` with torch's ``cpp_extension.load`` the first time an engine
joins a process group on the CPU: 2-6 minutes on 2 busy cores, into ``TORCH_EXTENSIONS_DIR``. torch guards
each build folder with a file named ``lock`` that it creates, holds open while it builds (every new process
takes it, even when there is nothing to rebuild) and deletes when done. A process killed in between (a test's
timeout) leaves the file, and every later load waits on it forever: one slow build used to turn into a chain
of DeepSpeed tests each sleeping until its own timeout.

The tests keep that op off unless ``OVERDRIVE_TEST_DEEPSPEED_SHM=1`` (tests/support/no_shm_op/); with it,
tests/conftest.py builds the op once, before the first test that starts a DeepSpeed engine (marker
``deepspeed``), with its own limit and a message. Before every test it removes the locks that no live process
holds open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BUILD_TIMEOUT_S = float(os.environ.get("OVERDRIVE_TEST_BUILD_TIMEOUT", "1200"))
# a lock younger than this is left alone: torch closes its file a moment before deleting it
MIN_STALE_AGE_S = 5.0
# DeepSpeed's op that a CPU engine builds (deepspeed/comm/torch.py: build_shm_op)
_BUILD = """
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load()
"""


def extensions_dir() -> Path:
    """Where torch builds and looks up JIT extensions in this environment."""
    from_env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if from_env:
        return Path(from_env)
    return Path.home() / ".cache" / "torch_extensions"  # torch's default (tests/conftest.py sets the variable)


def _open_files() -> set[str]:
    """The paths every process this user can see holds open."""
    held = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                try:
                    held.add(os.readlink(fd))
                except OSError:
                    continue
        except OSError:  # the process ended, or belongs to another user
            continue
    return held


def stale_locks(root: Path) -> list[Path]:
    """Build locks under ``root`` (``root/<extension>/lock``) that no live process holds open."""
    locks = [path for path in root.glob("*/lock")
             if time.time() - path.stat().st_mtime >= MIN_STALE_AGE_S]
    if not locks:
        return []
    held = _open_files()
    return [path for path in locks if str(path.resolve()) not in held]


def clear_stale_locks(root: Path | None = None) -> list[Path]:
    """Delete the stale build locks under ``root`` (the extensions folder by default); returns them."""
    removed = []
    for path in stale_locks(root or extensions_dir()):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _built() -> bool:
    folder = extensions_dir() / "deepspeed_shm_comm"
    return (folder / "deepspeed_shm_comm.so").exists() and not (folder / "lock").exists()


def build_deepspeed_ops(say) -> str | None:
    """Build DeepSpeed's CPU op once, in a child process with its own limit; ``say`` prints a line. Returns
    None when the op is there, else what went wrong (for the tests that need it to report)."""
    if _built():
        return None
    clear_stale_locks()
    say(f"overdrive tests: building DeepSpeed's C++ op deepspeed_shm_comm once into {extensions_dir()} "
        f"(2-6 min on 2 cores; limit {BUILD_TIMEOUT_S:.0f} s, OVERDRIVE_TEST_BUILD_TIMEOUT); later runs reuse it")
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", _BUILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        child.communicate()
        clear_stale_locks()
        return (f"DeepSpeed's op deepspeed_shm_comm did not build within {BUILD_TIMEOUT_S:.0f} s "
                "(raise OVERDRIVE_TEST_BUILD_TIMEOUT on a slow machine)")
    if child.returncode != 0:
        return f"DeepSpeed's op deepspeed_shm_comm failed to build (exit {child.returncode}):\n{output[-3000:]}"
    say(f"overdrive tests: deepspeed_shm_comm built in {time.monotonic() - started:.0f} s")
    return None
