"""Create the default process group the way torchrun expects, restart-safe."""

from __future__ import annotations

import atexit
import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from overdrive.runtime import group, watchdog
from overdrive.runtime.cluster import ProcessInfo
from overdrive.runtime.torch_private import default_store_address, group_timeout

#: How long a collective may wait for the other ranks on the CPU (gloo) before the job ends with a hang
#: report; far below torch's 10 minutes, so a hung rank costs minutes, not the job's allocation.
CPU_TIMEOUT = timedelta(minutes=3)
#: On accelerators (NCCL...) first steps can be slow (compilation, lazy init): torch's own default.
DEVICE_TIMEOUT = timedelta(minutes=10)
#: the watchdog's keys in the store of a group made outside overdrive
ADOPTED_PREFIX = "overdrive/adopted"
#: rank 0's own store for the watchdog, where the adopted group's store cannot be shared (kept alive here)
_announced_store: Any = None


def default_timeout(device: torch.device) -> timedelta:
    """The process-group timeout when none is given: ``CPU_TIMEOUT`` on the CPU, else ``DEVICE_TIMEOUT``."""
    return CPU_TIMEOUT if device.type == "cpu" else DEVICE_TIMEOUT


def ensure_process_group(info: ProcessInfo, device: torch.device, backend: str | None = None,
                         timeout: timedelta | None = None, stall_timeout: float | None = None) -> bool:
    """Join the default process group unless there is one already; return whether one exists.

    The store is a client TCPStore under a prefix named after the restart attempt when torchrun's agent
    hosts it: a plain ``init_process_group`` after a TorchElastic restart reuses the previous attempt's keys
    and fails to connect, while a fresh prefix per attempt restarts cleanly.
    """
    if not info.is_distributed:
        return dist.is_available() and dist.is_initialized()
    if dist.is_initialized():
        watch_adopted_group(info, device, timeout, stall_timeout)
        return True
    backend = backend or dist.get_default_backend_for_device(device)
    timeout = timeout or default_timeout(device)
    is_master = info.rank == 0 and not info.agent_store
    store = dist.TCPStore(info.master_addr, info.master_port, world_size=info.world_size if is_master else None,
                          is_master=is_master, timeout=timeout, wait_for_workers=False)
    # rank 0's own store is new every round; the restart count can differ between machines (a membership
    # change counts none), so only the agent's store, which keeps its keys, takes a prefix per attempt
    prefix = f"overdrive/attempt_{info.restart_count}" if info.agent_store else "overdrive/attempt"
    prefixed = dist.PrefixStore(prefix, store)
    kwargs: dict[str, Any] = {"device_id": device} if device.type != "cpu" else {}
    # torch's flight recorder keeps the last collectives (gloo too): the hang report names the one waited on.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
    dist.init_process_group(backend=backend, store=prefixed, rank=info.rank, world_size=info.world_size,
                            timeout=timeout, **kwargs)
    atexit.register(let_threads_settle)  # registered first, so it runs after the watchdog's exit hook
    watchdog.start(dist.distributed_c10d._get_default_group(), info.rank, info.world_size, info.master_addr,
                   info.master_port, prefix, timeout, node_rank=info.node_rank,
                   stall_timeout=stall_timeout)
    return True


def watch_adopted_group(info: ProcessInfo, device: torch.device, timeout: timedelta | None = None,
                        stall_timeout: float | None = None) -> None:
    """Start the hang watchdog on a default group made outside overdrive (Ray Train's ``TorchTrainer``, a
    script's own ``init_process_group``), unless one runs: on the group's own TCP store where torch says where
    it is, else on a store that rank 0 makes and announces over the group. Its reports name the group's own
    timeout (else ``timeout``, else the default)."""
    pg = group.default_group()
    dog = watchdog.active()
    if dog is not None and dog.pg is pg:  # watched already (a second Accelerator, or overdrive made it)
        return
    address = default_store_address() or _announce_store(info.master_addr)
    timeout = group_timeout(pg, device) or timeout or default_timeout(device)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")  # read when the first collective is recorded
    watchdog.start(pg, group.rank(), group.world_size(), address[0], address[1], ADOPTED_PREFIX, timeout,
                   node_rank=info.node_rank, stall_timeout=stall_timeout, adopted=True)


def _announce_store(host: str) -> tuple[str, int]:
    """A TCP store on rank 0 (at ``host``, a free port), its address sent to every rank over the default group."""
    global _announced_store
    where: list[Any] = [None]
    if group.rank() == 0:
        _announced_store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        where = [(host, int(_announced_store.port))]
    dist.broadcast_object_list(where, src=0)
    return where[0]


def let_threads_settle(limit: float = 2.0) -> None:
    """At exit, give the GIL away until no other thread of this process is runnable (at most ``limit`` s).

    gloo's worker thread drops the last collective's work object, whose tensors are Python objects, only
    once it gets the GIL; if the interpreter has begun to shut down by then, the thread is ended inside a
    C++ destructor and the process aborts ("terminate called without an active exception") after a
    successful run. A fixed pause is not enough on a loaded machine, so this waits for the threads
    themselves. Destroying the group at exit does not help while DDP holds it.
    """
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):  # not Linux: the plain pause
        time.sleep(0.1)
        return
    me = str(threading.get_native_id())
    deadline = time.monotonic() + limit
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # releases the GIL: a thread waiting for it becomes runnable
        quiet = 0 if any(_runnable(tasks, tid) for tid in os.listdir(tasks) if tid != me) else quiet + 1


def _runnable(tasks: str, tid: str) -> bool:
    try:
        with open(f"{tasks}/{tid}/stat") as f:
            stat = f.read()
    except OSError:  # the thread ended meanwhile
        return False
    return stat.rpartition(")")[2].split()[0] == "R"  # the field after the name, which may hold ")"
