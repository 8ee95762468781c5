"""``overdrive doctor --together``: the checks that need every machine at once. Started on every machine
within ``--timeout`` seconds, the doctors meet in a TCP store on the main machine's port, compare what each
machine runs (overdrive, torch and Python versions), measure the clocks against the main machine's, and run
one tiny all-reduce over gloo, one process per machine: the path a job's collectives take, interfaces and
firewalls included. Imports torch (the other checks do not)."""

from __future__ import annotations

import json
import platform
import socket
import time
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from overdrive._version import __version__


class Check(NamedTuple):
    """One finding, as ``overdrive.cli.doctor.Check`` takes it (status "ok", "warn" or "FAIL")."""

    name: str
    status: str
    detail: str
    fix: str = ""

#: clocks further apart than this make logs and checkpoint times across machines hard to read
CLOCK_WARN_S = 1.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def check_together(num_machines: int, machine_rank: int, address: str, port: int, timeout: float) -> list[Check]:
    """Meet the other machines' doctors at ``address``:``port`` and return the cross-machine findings."""
    limit = timedelta(seconds=timeout)
    try:
        root = dist.TCPStore(address, port, world_size=num_machines, is_master=machine_rank == 0, timeout=limit,
                             wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - any failure to meet is the finding
        return [Check("together", "FAIL", f"could not meet at {address}:{port} ({_first_line(exc)})",
                      "start 'overdrive doctor --together' on every machine within --timeout seconds, machine 0 "
                      "first; check --main_process_ip and the port")]
    store = dist.PrefixStore("overdrive_doctor", root)
    me = {"host": socket.gethostname(), "overdrive": __version__, "torch": torch.__version__,
          "python": platform.python_version()}
    store.set(f"machine/{machine_rank}", json.dumps(me))
    keys = [f"machine/{r}" for r in range(num_machines)]
    try:
        store.wait(keys, limit)
    except Exception:  # noqa: BLE001 - a timeout: name who is missing
        missing = [r for r in range(num_machines) if not store.check([keys[r]])]
        return [Check("together", "FAIL", f"machine{'s' if len(missing) > 1 else ''} "
                      f"{', '.join(map(str, missing))} did not come within {timeout:g} s",
                      "run 'overdrive doctor --together' on every machine at the same time")]
    machines = {r: json.loads(store.get(keys[r])) for r in range(num_machines)}
    checks = [_versions(machines), _clocks(store, machine_rank, num_machines, limit)]
    checks.append(_all_reduce(store, machine_rank, num_machines, limit, dist, torch))
    return checks


def _versions(machines: dict[int, dict[str, Any]]) -> Check:
    differ = [k for k in ("overdrive", "torch", "python") if len({m[k] for m in machines.values()}) > 1]
    if differ:
        table = "; ".join(f"machine {r} ({m['host']}): " + ", ".join(f"{k} {m[k]}" for k in differ)
                          for r, m in machines.items())
        return Check("versions", "FAIL", f"the machines run different {', '.join(differ)}: {table}",
                     "install the same versions everywhere (mismatched torch versions fail in collectives)")
    first = machines[0]
    return Check("versions", "ok", f"every machine runs overdrive {first['overdrive']}, torch {first['torch']}, "
                 f"Python {first['python']}")


def _clocks(store: Any, rank: int, world: int, limit: timedelta) -> Check:
    # every machine reads its clock right after the same moment (machine 0's "go"): the spread is the skew,
    # give or take one store round trip
    if rank == 0:
        store.set("go", "1")
    store.wait(["go"], limit)
    store.set(f"clock/{rank}", repr(time.time()))
    store.wait([f"clock/{r}" for r in range(world)], limit)
    clocks = {r: float(store.get(f"clock/{r}")) for r in range(world)}
    skew = {r: clocks[r] - clocks[0] for r in range(world)}
    worst = max(skew, key=lambda r: abs(skew[r]))
    text = ", ".join(f"machine {r} {skew[r]:+.3f} s" for r in range(1, world))
    if abs(skew[worst]) > CLOCK_WARN_S:
        return Check("clocks", "warn", f"against machine 0: {text}",
                     "synchronise the clocks (NTP / chrony): logs and checkpoint times disagree otherwise")
    return Check("clocks", "ok", f"within {CLOCK_WARN_S:g} s of machine 0 ({text})")


def _all_reduce(store: Any, rank: int, world: int, limit: timedelta, dist: Any, torch: Any) -> Check:
    try:
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                                timeout=limit)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the finding
        return Check("all-reduce", "FAIL", f"a gloo all-reduce across the machines failed ({_first_line(exc)})",
                     "the machines cannot open connections to each other's addresses: set GLOO_SOCKET_IFNAME "
                     "(NCCL_SOCKET_IFNAME) to the interface they share, open the firewall between them")
    want = world * (world + 1) / 2
    if value.item() != want:
        return Check("all-reduce", "FAIL", f"a gloo all-reduce across the machines gave {value.item()}, not {want}",
                     "report this: the machines disagree about the job")
    return Check("all-reduce", "ok", f"a gloo all-reduce over {world} machines (one process each) gave {want:g}")
