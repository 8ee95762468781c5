"""Run a function on several processes from Python or Jupyter, through torch.distributed.elastic.

    from overdrive import notebook_launcher
    notebook_launcher(training_function, args=(model_name,), num_processes=2)

The processes are started by TorchElastic's agent (``elastic_launch`` with a ``LaunchConfig``), like
``overdrive launch`` does for scripts. A function that a fresh interpreter can import (defined in a
module, or in a script's ``__main__``) starts in spawned processes; one defined in a notebook cell
cannot be imported, so on Linux its processes are forked from the notebook instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from overdrive.config.choices import invalid_choice
from overdrive.launchers.failure_report import describe_failures
from overdrive.launchers.launch_plan import default_threads
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, encode_launch_config
from overdrive.launchers.settings import MIXED_PRECISION, RDZV_BACKENDS
from overdrive.launchers.torchrun import LaunchError, patched_environ, quiet_torchelastic
from overdrive.runtime.cluster import detect_process_info
from overdrive.runtime.device import select_device
from overdrive.runtime.process_group import ensure_process_group


def _run_function(function: Callable[..., Any], threads: int, *args: Any) -> Any:
    """What each worker runs: the thread count first (forked children keep the parent's thread pool size,
    whatever OMP_NUM_THREADS says), then the function."""

    torch.set_num_threads(threads)
    return function(*args)


def _importable(function: Callable[..., Any]) -> bool:
    module = sys.modules.get(getattr(function, "__module__", ""), None)
    if module is None:
        return False
    if function.__module__ == "__main__" and not getattr(module, "__file__", None):
        return False  # a notebook or REPL: a new interpreter has no way to find it
    return "<locals>" not in getattr(function, "__qualname__", "<locals>")


def _start_method(function: Callable[..., Any]) -> str:
    if _importable(function):
        return "spawn"
    if sys.platform == "win32":
        raise ValueError(f"{function!r} cannot be imported by new processes and this platform cannot fork: "
                         "define it in a module (a .py file) and import it")
    return "fork"


def _check_fresh(num_processes: int) -> None:
    if dist.is_available() and dist.is_initialized():
        raise ValueError("a process group already exists in this process: create the Accelerator inside the "
                         "function given to notebook_launcher, not before it (restart the kernel)")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise ValueError(f"CUDA was already used in this process, so {num_processes} processes cannot be "
                         "forked from it: restart the kernel and create the model and Accelerator inside "
                         "the function given to notebook_launcher")


def _elastic_run(function: Callable[..., Any], args: tuple, *, nproc_per_node: int, num_nodes: int,
                 rdzv_backend: str, rdzv_endpoint: str, rdzv_configs: dict[str, Any], rdzv_id: str,
                 max_restarts: int, monitor_interval: float, worker_config: dict[str, Any],
                 log_line_prefix_template: str | None = None) -> dict[int, Any]:
    # lazy: torchelastic's launcher loads only when processes start
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # lazy: as above
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # lazy: as above

    log_dir = tempfile.mkdtemp(prefix="overdrive-notebook-")
    threads = default_threads(nproc_per_node)
    config = LaunchConfig(
        min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=nproc_per_node, run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend, rdzv_configs=rdzv_configs,
        max_restarts=max_restarts, monitor_interval=monitor_interval, start_method=_start_method(function),
        logs_specs=DefaultLogsSpecs(log_dir=log_dir), log_line_prefix_template=log_line_prefix_template,
    )
    env = {LAUNCH_CONFIG_VAR: encode_launch_config(worker_config),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    try:
        with patched_environ(env), quiet_torchelastic(debug=False):
            return elastic_launch(config, _run_function)(function, int(env["OMP_NUM_THREADS"]), *args)
    except ChildFailedError as err:
        report, code = describe_failures(err.failures, log_dir, max_restarts)
        raise LaunchError(report.replace("overdrive launch:", f"{getattr(function, '__name__', repr(function))}:", 1), code) from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def notebook_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, rdzv_backend: str = "static",
                      rdzv_endpoint: str = "", rdzv_conf: dict[str, Any] | None = None, rdzv_id: str = "none",
                      max_restarts: int = 0, monitor_interval: float = 0.1,
                      log_line_prefix_template: str | None = None) -> dict[int, Any]:
    """Run ``function(*args)`` on ``num_processes`` processes of this machine (of ``num_nodes`` machines).

    ``num_processes`` defaults to the number of accelerator devices (one process, here, when there are
    none or one). Create the ``Accelerator`` inside ``function``. Returns each rank's return value
    (``{rank: value}``, this machine's ranks); a failed rank raises ``LaunchError`` naming it, its exit
    code or signal, and the end of its traceback::

        def train(lr):
            accelerator = Accelerator()
            ...
        notebook_launcher(train, args=(1e-3,), num_processes=2)
    """

    if str(mixed_precision).lower() not in MIXED_PRECISION:
        # Accelerate's opening words, which callers match, then overdrive's choices and nearest one
        raise ValueError("Unknown mixed_precision mode: " + invalid_choice(f"mixed_precision={mixed_precision!r}",
                                                                          mixed_precision, MIXED_PRECISION))
    if rdzv_backend not in RDZV_BACKENDS:
        raise ValueError(invalid_choice(f"rdzv_backend={rdzv_backend!r}", rdzv_backend, RDZV_BACKENDS))
    cpu = not torch.accelerator.is_available()
    if num_processes is None:
        num_processes = 1 if cpu else torch.accelerator.device_count()
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} is not valid; give a whole number of processes >= 1")
    worker_config = {"cpu": cpu, "mixed_precision": str(mixed_precision).lower(),
                     "num_processes": num_processes * num_nodes, "num_machines": num_nodes, "machine_rank": node_rank}
    if num_processes == 1 and num_nodes == 1:
        with patched_environ({LAUNCH_CONFIG_VAR: encode_launch_config(worker_config)}):
            return {0: function(*args)}
    _check_fresh(num_processes)
    configs = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        configs["rank"] = node_rank
    return _elastic_run(function, tuple(args), nproc_per_node=num_processes, num_nodes=num_nodes,
                        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint or f"{master_addr}:{use_port}",
                        rdzv_configs=configs, rdzv_id=rdzv_id, max_restarts=max_restarts,
                        monitor_interval=monitor_interval, worker_config=worker_config,
                        log_line_prefix_template=log_line_prefix_template)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> dict[int, Any]:
    """Run ``function(*args)`` on ``num_processes`` CPU processes joined by gloo, for tests and debugging.

    The processes meet on a free port of this machine; returns ``{rank: return value}``.
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} is not valid; give a whole number of processes >= 1")
    worker_config = {"cpu": True, "mixed_precision": "no", "num_processes": num_processes, "num_machines": 1}
    return _elastic_run(function, tuple(args), nproc_per_node=num_processes, num_nodes=1, rdzv_backend="c10d",
                        rdzv_endpoint="localhost:0", rdzv_configs={}, rdzv_id=str(uuid.uuid4()), max_restarts=0,
                        monitor_interval=0.1, worker_config=worker_config)


def test_launch() -> None:
    """Check that this process can take its place in the launched job: find its rank and world size in the
    launcher's variables and join the process group (what ``PartialState()`` does first)."""
    info = detect_process_info()
    ensure_process_group(info, select_device(info.local_rank))
