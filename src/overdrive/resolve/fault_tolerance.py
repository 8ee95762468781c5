"""The resolver's fault-tolerance step: with ``--ft_lighthouse`` (``OVERDRIVE_FT_LIGHTHOUSE``) the run trains
through torchft: this launch is one replica group, data parallel inside it (DDP, or FSDP2's sharding when FSDP
is asked for: the strategies ``ft_ddp`` and ``ft_fsdp2``, ``strategies/fault_tolerant*.py``), and groups that are
lost drop out of the step while the others go on."""

from __future__ import annotations

import copy
import importlib.util
import socket
from dataclasses import dataclass, field
from typing import Any

from overdrive.config import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin
from overdrive.launchers.setting_kinds import LighthouseAddress
from overdrive.resolve.process import ProcessPlan
from overdrive.runtime.mesh import ParallelDims

#: how long a quorum, a commit or a transfer between groups may take without --timeout
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class FaultTolerantSettings:
    """Data parallel across replica groups through torchft (``--ft_lighthouse``): this process's group, the
    number of groups the data is sharded over, the lighthouse, the store of this group (None: the strategy
    starts one: a group of one process not started by torchrun), the time a quorum or a transfer may take,
    and the data parallel inside the group: DDP's options, or FSDP2's plugin."""

    lighthouse: str
    replica_group: int = 0
    num_replica_groups: int = 1
    store: tuple[str, int] | None = None
    timeout_s: float = 60.0
    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    #: FSDP2's settings when each group shards the model over its processes (``ft_fsdp2``); None: DDP inside
    fsdp: FullyShardedDataParallelPlugin | None = None


def resolve_fault_tolerance(launched: dict[str, Any], process: ProcessPlan, strategy: str,
                            ddp: DistributedDataParallelKwargs | None, errors: list[str], *,
                            fsdp: FullyShardedDataParallelPlugin | None = None,
                            dims: ParallelDims | None = None) -> FaultTolerantSettings | None:
    """The fault-tolerant settings the launch config asks for (None: not asked for); problems are appended
    to ``errors``. ``strategy`` is the one the run would use without fault tolerance; with ``fsdp2`` (its
    plugin ``fsdp``, the group's mesh sizes ``dims``) each group shards the model over its processes."""
    raw = launched.get("ft_lighthouse")
    if not raw:
        return None
    address, problem = LighthouseAddress().check("ft_lighthouse", raw)
    if problem:
        errors.append(problem)
        return None
    problem = _inside_a_group_problem(str(address), strategy, dims or ParallelDims())
    if problem:
        errors.append(problem)
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
    sharded = strategy == "fsdp2" and (dims or ParallelDims()).shards_parameters  # one process: nothing to shard
    return FaultTolerantSettings(lighthouse=str(address), replica_group=group, num_replica_groups=groups,
                                 store=store, timeout_s=timeout,
                                 options=copy.copy(ddp) if ddp is not None else DistributedDataParallelKwargs(),
                                 fsdp=copy.copy(fsdp or FullyShardedDataParallelPlugin()) if sharded else None)


def _inside_a_group_problem(address: str, strategy: str, dims: ParallelDims) -> str | None:
    """Why the parallelism asked for cannot run inside a replica group (None: it can): data parallel (DDP)
    or FSDP2 sharding over the group's processes, nothing else."""
    if strategy in ("single", "ddp"):
        return None
    others = {"tensor parallel (tp_size)": dims.tp, "context parallel (cp_size)": dims.cp,
              "replicas inside the group (dp_replicate_size)": dims.dp_replicate}
    if strategy == "fsdp2" and all(size == 1 for size in others.values()):
        return None
    asked = ", ".join(f"{name} {size}" for name, size in others.items() if size > 1) if strategy == "fsdp2" else ""
    return (f"ft_lighthouse={address!r} with the {strategy!r} strategy{f' ({asked})' if asked else ''}: "
            "fault-tolerant training runs data parallel (DDP) or FSDP2 sharding over each replica group's processes, "
            "and the groups are the replicas; leave out DeepSpeed, pipeline, tensor and context parallel settings "
            "and dp_replicate_size, or leave out --ft_lighthouse")
