"""The resolver's fault-tolerance step: with ``--ft_lighthouse`` (``OVERDRIVE_FT_LIGHTHOUSE``) the run trains
through torchft: this launch is one replica group, data parallel inside it, and groups that are lost drop out
of the step while the others go on (the strategy ``ft_ddp``, ``strategies/fault_tolerant.py``)."""

from __future__ import annotations

import copy
import importlib.util
import socket
from dataclasses import dataclass, field
from typing import Any

from overdrive.config import DistributedDataParallelKwargs
from overdrive.launchers.setting_kinds import LighthouseAddress
from overdrive.resolve.process import ProcessPlan

#: how long a quorum, a commit or a transfer between groups may take without --timeout
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class FaultTolerantSettings:
    """Data parallel across replica groups through torchft (``--ft_lighthouse``): this process's group, the
    number of groups the data is sharded over, the lighthouse, the store of this group (None: the strategy
    starts one: a group of one process not started by torchrun), the time a quorum or a transfer may take,
    and DDP's own options inside the group."""

    lighthouse: str
    replica_group: int = 0
    num_replica_groups: int = 1
    store: tuple[str, int] | None = None
    timeout_s: float = 60.0
    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)


def resolve_fault_tolerance(launched: dict[str, Any], process: ProcessPlan, strategy: str,
                            ddp: DistributedDataParallelKwargs | None,
                            errors: list[str]) -> FaultTolerantSettings | None:
    """The fault-tolerant settings the launch config asks for (None: not asked for); problems are appended
    to ``errors``."""
    raw = launched.get("ft_lighthouse")
    if not raw:
        return None
    address, problem = LighthouseAddress().check("ft_lighthouse", raw)
    if problem:
        errors.append(problem)
        return None
    if strategy not in ("single", "ddp"):
        errors.append(f"ft_lighthouse={address!r} with the {strategy!r} strategy: fault-tolerant training runs data "
                      "parallel (DDP) inside each replica group; leave out FSDP, DeepSpeed, pipeline and tensor "
                      "parallel settings, or leave out --ft_lighthouse")
        return None
    if importlib.util.find_spec("torchft") is None:
        errors.append(f"ft_lighthouse={address!r} needs the 'torchft' package, which cannot be imported here; "
                      "install it with: pip install 'overdrive[ft]' (or pip install torchft)")
        return None
    group = launched.get("ft_replica_group")
    groups = launched.get("ft_num_replica_groups")
    group = int(group) if group is not None else int(launched.get("machine_rank") or 0)
    groups = int(groups) if groups is not None else int(launched.get("num_machines") or 1)
    if group >= groups:
        errors.append(f"ft_replica_group={group} is not below ft_num_replica_groups={groups}; number the replica "
                      f"groups 0 .. {groups - 1} (or raise ft_num_replica_groups)")
    info = process.info
    store = None
    if info.is_distributed or info.agent_store:
        # the other groups reach this group's store at the address torchft hands them: a loopback address
        # would name their own machine (the store listens on every interface)
        local = info.master_addr in ("127.0.0.1", "localhost", "::1")
        store = (socket.gethostname() if local else info.master_addr, info.master_port)
    timeout = process.timeout.total_seconds() if process.timeout is not None else DEFAULT_TIMEOUT_S
    return FaultTolerantSettings(lighthouse=str(address), replica_group=group, num_replica_groups=groups,
                                 store=store, timeout_s=timeout,
                                 options=copy.copy(ddp) if ddp is not None else DistributedDataParallelKwargs())
