"""Test-tree setup: markers, and the process-group and build-lock guards.

The tests mirror ``src/overdrive`` (``tests/strategies/`` tests ``overdrive/strategies/``, ...); the tests of
the package's root modules and of the project as a whole (docs, layering, examples) sit in ``tests/``.
``tests`` is a package: shared helpers are imported by their package path (``from tests.support.distributed
import run_distributed``, ``from tests.support.cli import overdrive``); nothing here touches ``sys.path``
(pyproject's ``pythonpath`` puts the repository root and ``examples/`` on it).

Markers (registered in pyproject; select with ``-m``, e.g. ``pytest -m "not slow and not multiprocess"``):

- ``multiprocess``: starts processes (a gloo group, torchrun or the CLI's launcher). Added here to every
  test of a module that uses ``run_distributed`` or ``free_port``; mark launch tests by hand.
- ``slow``: takes more than ~20 s on a 2-core machine.
- ``requires("name", ...)``: needs these importable top-level packages from outside overdrive's own
  dependencies (the test extra has them all); skipped here, naming the missing ones, when one is absent.
  Implies ``optional``. The one place a test states what it needs: no ``skipif(find_spec(...))`` or
  ``pytest.importorskip`` in test modules.
- ``optional``: needs a package outside overdrive's own dependencies (added by ``requires``; by hand for a
  test that skips by itself on what it finds).
- ``gpu``: needs a CUDA device; skipped here when there is none.
- ``deepspeed``: starts a DeepSpeed engine (implies ``requires("deepspeed")``).

DeepSpeed runs without its C++ op ``deepspeed_shm_comm`` (a shared-memory allreduce for CPU ranks, 2-6 min to
build per fresh environment) in every test process and every process a test starts: its collectives go
through torch.distributed's gloo, the same sums (tests/support/no_shm_op/sitecustomize.py, put on
``PYTHONPATH`` here). ``OVERDRIVE_TEST_DEEPSPEED_SHM=1`` keeps the op: it is then built once before the first
``deepspeed`` test (tests/support/build_locks.py). Either way no test waits on a build lock a killed test left
behind.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.build_locks import build_deepspeed_ops, clear_stale_locks, extensions_dir
from tests.support.no_shm_op import sitecustomize as no_shm_op

# DeepSpeed builds its C++ ops on first use into TORCH_EXTENSIONS_DIR. One folder per environment: checkouts
# sharing a machine would otherwise rebuild each other's copy (their include paths differ) and wait on its lock.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
# DeepSpeed's shared-memory op stays off (no build) unless asked for: here, and in every child process
DEEPSPEED_SHM = os.environ.get("OVERDRIVE_TEST_DEEPSPEED_SHM", "") == "1"
if not DEEPSPEED_SHM:
    no_shm_op.install()
    if no_shm_op.FOLDER not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (no_shm_op.FOLDER, os.environ.get("PYTHONPATH"))))

def _destroy_process_group() -> None:
    comm = sys.modules.get("deepspeed.comm")
    if comm is not None and comm.is_initialized():
        comm.destroy_process_group()  # forgets DeepSpeed's cached groups too (the next engine would use them)
    else:
        import torch.distributed as dist

        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _no_process_group_left_behind() -> Iterator[None]:
    """Fail the test that leaves a torch.distributed process group or a new LOCAL_RANK in the pytest process
    (the tests after it would run inside that group, or the real Accelerate would try to join one), and undo
    both so that they don't. Costs two dictionary lookups unless torch.distributed was imported."""
    local_rank = os.environ.get("LOCAL_RANK")
    yield
    left = []
    if os.environ.get("LOCAL_RANK") != local_rank:
        left.append(f"LOCAL_RANK={os.environ.get('LOCAL_RANK')!r} (was {local_rank!r})")
        if local_rank is None:
            del os.environ["LOCAL_RANK"]
        else:
            os.environ["LOCAL_RANK"] = local_rank
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _destroy_process_group()
        left.append("a torch.distributed process group initialised")
    if left:
        pytest.fail(f"this test left {' and '.join(left)}; undo it in its teardown (the one_process_group "
                    "fixture does, for DeepSpeed in one process)", pytrace=False)


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """For a test that runs DeepSpeed in the pytest process: DeepSpeed needs a process group (and LOCAL_RANK)
    even for one process, and overdrive makes them; both are gone after the test (a LOCAL_RANK left behind
    makes the real Accelerate of a later test join a group through env://)."""
    local_rank = os.environ.get("LOCAL_RANK")
    yield
    if local_rank is None:
        os.environ.pop("LOCAL_RANK", None)
    else:
        os.environ["LOCAL_RANK"] = local_rank
    import torch.distributed as dist

    if dist.is_initialized():
        _destroy_process_group()


def _needed(item: pytest.Item) -> list[str]:
    """The packages a test's ``requires`` markers (and its ``deepspeed`` marker) name."""
    names = [name for mark in item.iter_markers("requires") for name in mark.args]
    if item.get_closest_marker("deepspeed") is not None:
        names.append("deepspeed")
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            # find_spec("a.b") imports the package a: the real accelerate must never be imported here
            raise pytest.UsageError(f"{item.nodeid}: requires({name!r}): name top-level packages only, e.g. "
                                    "requires('transformers', 'accelerate')")
    return names


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands whole files to its workers in the collection's order (below: the slow files first),
    not sorted by their number of tests (its default: the one-test files, often the slowest, came last)."""
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their number of ``slow`` tests, most first (the files' own order otherwise, and each
    file's tests in theirs): with whole files to each of 2 workers, a long file started last is a long tail."""
    def file(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[file(item)] = slow.get(file(item), 0) + bool(item.get_closest_marker("slow"))
    order = {path: rank for rank, path in enumerate(sorted(slow, key=lambda path: -slow[path]))}
    items.sort(key=lambda item: order[file(item)])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark multi-process modules and the tests that need optional packages; skip the tests whose packages
    are missing, and the GPU tests on a machine without CUDA; the files with slow tests first."""
    gpu_skip = None
    found: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and any(hasattr(module, name) for name in ("run_distributed", "free_port")):
            item.add_marker(pytest.mark.multiprocess)
        needed = _needed(item)
        if needed:
            item.add_marker(pytest.mark.optional)
            missing = [n for n in dict.fromkeys(needed)
                       if not found.setdefault(n, importlib.util.find_spec(n) is not None)]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)} (the test extra: "
                                                        "pip install -e '.[test]')"))
        if item.get_closest_marker("gpu") is not None:
            if gpu_skip is None:
                import torch

                gpu_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
            item.add_marker(gpu_skip)
    _slow_files_first(items)


_DEEPSPEED_BUILD_PROBLEM = pytest.StashKey[str]()
_SHM_OP_BUILT_AT = pytest.StashKey[float | None]()


def _shm_op_built_at() -> float | None:
    """When DeepSpeed's op was last built in this environment (None: never)."""
    try:
        return (extensions_dir() / "deepspeed_shm_comm").stat().st_mtime
    except OSError:
        return None


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SHM_OP_BUILT_AT] = _shm_op_built_at()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Say so when a process the op was not kept off in built it (one that dropped the tests' PYTHONPATH)."""
    if DEEPSPEED_SHM or hasattr(session.config, "workerinput"):
        return
    if _shm_op_built_at() != session.config.stash.get(_SHM_OP_BUILT_AT, None):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"overdrive tests: a test process built DeepSpeed's op deepspeed_shm_comm in {extensions_dir()}: "
                f"keep {no_shm_op.FOLDER} on the PYTHONPATH of the processes tests start")
        if reporter is not None:
            reporter.write_line(line, yellow=True)
        else:
            print(line)


def pytest_collection_finish(session: pytest.Session) -> None:
    """With ``OVERDRIVE_TEST_DEEPSPEED_SHM=1``, build DeepSpeed's C++ op before the first test that needs it:
    outside every test's timeout, with its own limit and a message, so that a slow first build is not
    mistaken for (and killed as) a hung test."""
    if not DEEPSPEED_SHM or not any(item.get_closest_marker("deepspeed") for item in session.items):
        return
    if importlib.util.find_spec("deepspeed") is None:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    problem = build_deepspeed_ops(reporter.write_line if reporter is not None else print)
    if problem is not None:
        session.config.stash[_DEEPSPEED_BUILD_PROBLEM] = problem


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remove the build locks a killed test left behind (they would hold every later build forever), and
    fail a DeepSpeed test at once, with the reason, when the op could not be built before the tests."""
    clear_stale_locks()
    problem = item.config.stash.get(_DEEPSPEED_BUILD_PROBLEM, None)
    if problem is not None and item.get_closest_marker("deepspeed") is not None:
        pytest.fail(problem, pytrace=False)
