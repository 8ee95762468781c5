"""Every test process, and every process a test starts, runs DeepSpeed without its C++ op ``deepspeed_shm_comm``.

DeepSpeed builds that op (its shared-memory allreduce shortcut for CPU ranks, deepspeed/comm/torch.py:
``build_shm_op``) the first time an engine joins a process group: 2-6 minutes of compiling per fresh
environment, one test worker waiting on it. ``build_shm_op`` returns None, and DeepSpeed then runs every
collective through torch.distributed (gloo here: the same sums), when ``deepspeed.ops.__compatible_ops__``
marks the op not compatible. This module does that, in the process that imports ``deepspeed.ops``.

tests/conftest.py puts this folder on ``PYTHONPATH`` (Python imports a ``sitecustomize`` found there at start,
so every child process inherits it) and calls ``install()`` in the pytest process. ``OVERDRIVE_TEST_DEEPSPEED_SHM=1``
leaves the op on: conftest then builds it before the first DeepSpeed test (tests/support/build_locks.py).
Only ``sys`` is imported at start (tests/test_startup_imports.py counts a fresh process's modules); the
rest only in a process that imports DeepSpeed.
"""

from __future__ import annotations

import os
import sys

OP = "deepspeed_shm_comm"
FOLDER = os.path.dirname(os.path.abspath(__file__))


def mark_not_compatible(ops_module) -> None:
    """Mark the op not compatible in ``deepspeed.ops`` (its table is computed on first use, by the module's
    ``__getattr__``, or at import in older versions)."""
    table = ops_module.__dict__.get("__compatible_ops__")
    if table is not None:
        table[OP] = False
        return
    compute = ops_module.__dict__.get("__getattr__")
    if compute is None:
        return  # a DeepSpeed without the table: nothing to mark (conftest reports a build, should one happen)

    def __getattr__(name: str):
        value = compute(name)
        if name == "__compatible_ops__":
            value[OP] = False
        return value

    ops_module.__getattr__ = __getattr__


class _MarkWhenImported:
    """Finds nothing itself: when ``deepspeed.ops`` is imported, lets the path finder load it, then marks it."""

    def find_spec(self, name, path=None, target=None):
        if name != "deepspeed.ops":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load = loader.exec_module

        def exec_module(module) -> None:
            load(module)
            mark_not_compatible(module)

        loader.exec_module = exec_module  # this spec's own loader
        return spec


def install() -> None:
    """Mark the op in this process: now if DeepSpeed's ops are imported, else when they are."""
    if "deepspeed.ops" in sys.modules:
        mark_not_compatible(sys.modules["deepspeed.ops"])
    elif not any(isinstance(finder, _MarkWhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MarkWhenImported())


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one hides (one later on ``sys.path``, e.g. a distribution's), if any."""
    later = [entry for entry in sys.path if os.path.abspath(entry or ".") != FOLDER]
    for entry in later:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            from importlib.util import module_from_spec, spec_from_file_location

            spec = spec_from_file_location("_hidden_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(module_from_spec(spec))
            return


if __name__ == "sitecustomize":
    install()
    _chain_next_sitecustomize()
