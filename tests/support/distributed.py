"""Run a function on N real CPU processes joined by a gloo process group.

Every rank gets the caller's environment plus what torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT on a free port), on a machine without a GPU the CPU setting (ACCELERATE_USE_CPU=true,
what ``accelerate launch --cpu`` sets: without it the processes would each train alone, as under Accelerate),
one intra-op thread, and a hard outer timeout. The function's return
value of each rank comes back in rank order; an exception on any rank fails the caller with that rank's
traceback.

The ranks are forked from multiprocessing's fork server, which imported torch once for the whole pytest
session (importing torch costs each process ~2 s of CPU on a 2-core machine, and the suite starts some 150
ranks): each rank is still a new process, holding nothing of the caller's or another rank's state, like a
spawned one. Only torch is preloaded (it starts no thread and touches no device on import), so overdrive and
everything else are imported fresh in every rank.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_module
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, env: dict,
            queue: Any, caller_env: dict | None = None) -> None:
    if caller_env is not None:  # the caller's environment as it is now (the fork server has its start's)
        os.environ.clear()
        os.environ.update(caller_env)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env,
    )
    import torch

    if not torch.accelerator.is_available():  # the CPU setting joins CPU processes, as under Accelerate
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    torch.set_num_threads(1)
    try:
        # Plain pickle (bytes) rather than the queue's pickler: tensors would otherwise travel as shared
        # memory handles that die with this process.
        result = pickle.dumps(fn(*args))
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 120,
                    env: dict | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` processes; return each rank's result, in rank order."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])  # read when the server starts: the first call of the session
    queue = ctx.Queue()
    port = free_port()
    caller_env = dict(os.environ)
    procs = [
        ctx.Process(target=_worker, args=(fn, rank, world_size, port, args, env or {}, queue, caller_env),
                    daemon=True)
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    failures: list[str] = []
    try:
        for _ in range(world_size):
            try:
                # once a rank failed, wait only briefly for the others' errors (they often hold the cause)
                rank, ok, value = queue.get(timeout=5 if failures else timeout)
            except queue_module.Empty as exc:
                if failures:
                    break
                missing = sorted(set(range(world_size)) - set(results))
                raise TimeoutError(f"ranks {missing} gave no result within {timeout}s") from exc
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failures.append(f"rank {rank} failed:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=5 if not failures else 0.5)
            if proc.is_alive():
                proc.kill()
    if failures:
        raise AssertionError("\n".join(failures))
    return [results[r] for r in range(world_size)]
