"""What keeps the fault-tolerant step (``--ft_lighthouse``) near plain DDP's cost (bench/ft_overhead.py times it):

- its processes keep freed blocks of a few MB for the next step on the CPU (glibc gives them back by default,
  and the next step faults them in page by page: ~5 ms a step on the benchmark's model);
- a replica group of one process commits on its own answer, without a round trip to its manager server.

The average across groups itself (pre-divided, not waited for) is proven equal to plain DDP in
test_fault_tolerant.py.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchft", reason="fault-tolerant training needs torchft (pip install 'overdrive[ft]')")

from overdrive.strategies.ft_reports import ReportingClient  # noqa: E402  (after the skip)

ROOT = Path(__file__).resolve().parents[2]

# Six blocks of 4 MB made, written and freed again and again (as an optimizer step makes its temporaries),
# straight through the C allocator; prints the minor page faults of the last 10 rounds.
_ROUNDS = """
import ctypes, resource, sys
if sys.argv[1] == "keep":
    from overdrive.strategies.fault_tolerant import _keep_freed_memory
    _keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def round_():
    blocks = [libc.malloc(4 << 20) for _ in range(6)]
    for block in blocks:
        ctypes.memset(block, 1, 4 << 20)
    for block in blocks:
        libc.free(block)
for _ in range(3):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator thresholds")
def test_freed_blocks_are_kept_for_the_next_step():
    by_default, kept = _faults("default"), _faults("keep")
    # by default every round faults its 24 MB in again (6,144 pages of 4 kB); kept, the rounds reuse them
    assert by_default > 10 * 1000, f"the default allocator faulted only {by_default} pages in 10 rounds"
    assert kept < 10 * 50, f"{kept} page faults in 10 rounds with the freed blocks kept (default: {by_default})"


class _Client:
    """Stands in for torchft's manager client: records the commits it is asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, bool]] = []

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: object) -> bool:
        self.asked.append((group_rank, step, should_commit))
        return True


@pytest.mark.parametrize("answer", [True, False])
def test_a_group_of_one_process_commits_on_its_own_answer(answer):
    client = _Client()
    assert ReportingClient(client, lambda _: None, alone=True).should_commit(0, 7, answer, timeout=None) is answer
    assert client.asked == []


def test_a_group_of_several_processes_asks_its_manager_server():
    client = _Client()
    assert ReportingClient(client, lambda _: None).should_commit(1, 7, False, timeout=None) is True
    assert client.asked == [(1, 7, False)]
