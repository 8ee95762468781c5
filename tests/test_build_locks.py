"""A C++ build killed mid-way (a test's timeout) must not hold every later build: the stale-lock chain that
turned one slow DeepSpeed build into nine timed-out tests, reproduced with torch's own loader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.build_locks import clear_stale_locks, stale_locks

_LOAD = """
import sys
from torch.utils.cpp_extension import load
load(name="overdrive_probe", sources=[sys.argv[1]])
"""


def _age(path: Path, seconds: float) -> None:
    os.utime(path, (time.time() - seconds, time.time() - seconds))


@pytest.mark.timeout(120)
def test_a_killed_build_leaves_a_lock_that_only_the_cleanup_removes(tmp_path):
    source = tmp_path / "probe.cpp"
    source.write_text("#include <torch/extension.h>\nint probe() { return 1; }\n"
                      "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"probe\", &probe); }\n")
    root = tmp_path / "extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    build = subprocess.Popen([sys.executable, "-c", _LOAD, str(source)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = root / "overdrive_probe" / "lock"
    try:
        deadline = time.monotonic() + 90
        while not lock.exists() and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists(), "the build never took its lock"
        _age(lock, 60)
        assert stale_locks(root) == []  # the build is alive and holds it: not stale
    finally:
        os.killpg(build.pid, signal.SIGKILL)  # what a test's timeout does to a build in progress
        build.wait()

    # the fault: torch's lock outlives the killed build, so the next load would wait on it forever
    assert lock.exists()
    from torch.utils.file_baton import FileBaton

    assert not FileBaton(str(lock)).try_acquire()

    assert clear_stale_locks(root) == [lock]  # what tests/conftest.py does before every test
    assert not lock.exists()
    baton = FileBaton(str(lock))
    assert baton.try_acquire()  # the next build proceeds
    baton.release()


def test_a_lock_held_open_or_just_made_is_left_alone(tmp_path):
    held = tmp_path / "ext_a" / "lock"
    fresh = tmp_path / "ext_b" / "lock"
    for path in (held, fresh):
        path.parent.mkdir()
    fd = os.open(held, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton holds it while building
    fresh.touch()
    try:
        _age(held, 60)
        assert clear_stale_locks(tmp_path) == []
        assert held.exists() and fresh.exists()
    finally:
        os.close(fd)
    assert clear_stale_locks(tmp_path) == [held]  # closed by a dead builder: stale; the fresh one stays
    assert fresh.exists()
