"""Cluster environments: read a process's rank and world from what its launcher set.

Each environment is a function that returns a ``ProcessInfo`` or ``None`` when its variables are absent;
``detect_process_info`` asks them in order. A new cluster manager is one more function in ``DETECTORS``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """This process's place in the job. ``run_id``: the launcher's id of the job (torchrun's
    TORCHELASTIC_RUN_ID), "" when unknown; ``agent_store``: torchrun's agent already hosts the TCPStore at
    MASTER_ADDR:MASTER_PORT (otherwise rank 0 hosts it)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    restart_count: int = 0
    run_id: str = ""
    agent_store: bool = False
    source: str = "single process"

    @property
    def is_distributed(self) -> bool:
        """Whether the job has more than one process."""
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


def from_torchrun(env: Mapping[str, str]) -> ProcessInfo | None:
    """torchrun / TorchElastic, or anything that sets the same variables (RANK, WORLD_SIZE, ...): Ray Train's
    ``TorchTrainer`` workers too (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR /
    MASTER_PORT), where Ray Train has made the process group before the loop starts, and it is adopted."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = _int(env, "WORLD_SIZE", 1)
    return ProcessInfo(
        rank=_int(env, "RANK", 0),
        world_size=world,
        local_rank=_int(env, "LOCAL_RANK", 0),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
        node_rank=_first_int(env, ("GROUP_RANK", "NODE_RANK"), 0),  # NODE_RANK: Ray Train's name
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500),
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
        run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        source="torchelastic" if "TORCHELASTIC_RUN_ID" in env else "environment (RANK/WORLD_SIZE)",
    )


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if env.get(name, "") != "":
            return _int(env, name, default)
    return default


def _mpi_info(env: Mapping[str, str], rank: str, size: str, local_rank: tuple[str, ...],
              local_size: tuple[str, ...], source: str) -> ProcessInfo | None:
    if rank not in env or size not in env:
        return None
    world = _int(env, size, 1)
    local_world = max(_first_int(env, local_size, world), 1)
    global_rank = _int(env, rank, 0)
    return ProcessInfo(
        rank=global_rank,
        world_size=world,
        local_rank=_first_int(env, local_rank, global_rank % local_world),
        local_world_size=local_world,
        # MPI launchers give no node index; with the same number of ranks on every node (mpirun's
        # default placement) it is the global rank divided by the ranks per node.
        node_rank=global_rank // local_world,
        # A launcher that knows nothing of torch cannot say where rank 0 lives: multi-node MPI jobs
        # export MASTER_ADDR (``mpirun -x MASTER_ADDR=...``).
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500),
        source=source,
    )


def from_open_mpi(env: Mapping[str, str]) -> ProcessInfo | None:
    """``mpirun`` of Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE."""
    return _mpi_info(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",),
                     ("OMPI_COMM_WORLD_LOCAL_SIZE",), "open mpi")


def from_mvapich(env: Mapping[str, str]) -> ProcessInfo | None:
    """MVAPICH2: MV2_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE."""
    return _mpi_info(env, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", ("MV2_COMM_WORLD_LOCAL_RANK",),
                     ("MV2_COMM_WORLD_LOCAL_SIZE",), "mvapich")


def from_pmi(env: Mapping[str, str]) -> ProcessInfo | None:
    """MPICH and Intel MPI (Hydra's PMI_RANK / PMI_SIZE, MPI_LOCALRANKID / MPI_LOCALNRANKS), Cray PALS."""
    # ``srun --mpi=pmi2`` sets PMI_RANK / PMI_SIZE too, without the Hydra local ids: fall back to SLURM's.
    return _mpi_info(env, "PMI_RANK", "PMI_SIZE",
                     ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"),
                     ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"),
                     "mpich / intel mpi")


def _tasks_per_node(spec: str, node: int) -> int | None:
    """SLURM's compressed per-node counts: ``"2(x3),1"`` is 2, 2, 2, 1; the count on node ``node``."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else (counts[0] if counts else None)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"gpu[003-004,010],cpu1"`` -> ``"gpu003"``."""
    nodelist = nodelist.strip()
    match = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist)
    if match is None or not match.group(2):
        return nodelist.split(",")[0]
    first = match.group(3).split(",")[0].split("-")[0]
    return match.group(1) + first


def from_slurm(env: Mapping[str, str]) -> ProcessInfo | None:
    """``srun``: one task per rank, from SLURM_PROCID, SLURM_(STEP_)NTASKS, SLURM_LOCALID, SLURM_NODEID."""
    if "SLURM_PROCID" not in env or not ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        return None
    world = _first_int(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1)
    node = _int(env, "SLURM_NODEID", 0)
    local_world = _first_int(env, ("SLURM_NTASKS_PER_NODE",), 0)
    if local_world <= 0:
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        local_world = _tasks_per_node(spec, node) or world
    master_addr = env.get("MASTER_ADDR")
    if not master_addr:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        master_addr = first_host(nodelist) if nodelist else "127.0.0.1"
    # Every task of a job derives the same port from the job id, so no one has to pass it around.
    default_port = 15000 + _int(env, "SLURM_JOB_ID", 0) % 20000 if "SLURM_JOB_ID" in env else 29500
    return ProcessInfo(
        rank=_int(env, "SLURM_PROCID", 0),
        world_size=world,
        local_rank=_int(env, "SLURM_LOCALID", 0),
        local_world_size=local_world,
        node_rank=node,
        master_addr=master_addr,
        master_port=_int(env, "MASTER_PORT", default_port),
        source="slurm",
    )


def launch_defaults(env: Mapping[str, str]) -> tuple[dict[str, int | str], str]:
    """Where ``overdrive launch`` runs, when one launcher per machine is started by a cluster manager:
    ``{"num_machines", "machine_rank", "main_process_ip", "main_process_port"}`` (those known) and the
    variables they came from; ({}, "") elsewhere. A flag still beats them, and they beat a config file
    (the same file on every machine cannot know each machine's rank).

    - SLURM (``srun --ntasks-per-node=1 overdrive launch ...``): SLURM_STEP_NUM_NODES / SLURM_NNODES,
      SLURM_NODEID, the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, and the port derived from
      SLURM_JOB_ID (as ``from_slurm``) unless MASTER_PORT is set.
    - Kubernetes / Kubeflow ``PyTorchJob``: the torchrun variables it sets, PET_NNODES (``MIN:MAX`` for an
      elastic job, kept as that text), PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT (MASTER_ADDR /
      MASTER_PORT when the PET_ ones are absent; an elastic job's PET_RDZV_ENDPOINT when neither is set),
      PET_RDZV_BACKEND and PET_MAX_RESTARTS (``elasticPolicy``).
    """
    found: dict[str, int | str] = {}
    if "PET_NNODES" in env or "PET_NODE_RANK" in env:
        nodes = env.get("PET_NNODES", "")
        if nodes.isdigit():
            found["num_machines"] = int(nodes)
        elif re.fullmatch(r"\d+:\d+", nodes):  # an elastic PyTorchJob (elasticPolicy minReplicas:maxReplicas)
            found["num_machines"] = nodes
        if env.get("PET_NODE_RANK", "").isdigit():
            found["machine_rank"] = int(env["PET_NODE_RANK"])
        addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
        port = env.get("PET_MASTER_PORT") or env.get("MASTER_PORT")
        endpoint = env.get("PET_RDZV_ENDPOINT", "")
        if not addr and endpoint:  # an elastic job's rendezvous, "host:port" or "host"
            host, sep, tail = endpoint.rpartition(":")
            addr, port = (host, tail) if sep else (endpoint, port)
        if addr:
            found["main_process_ip"] = addr
        if port and port.isdigit():
            found["main_process_port"] = int(port)
        if env.get("PET_RDZV_BACKEND"):
            found["rdzv_backend"] = env["PET_RDZV_BACKEND"]
        if env.get("PET_MAX_RESTARTS", "").isdigit():
            found["max_restarts"] = int(env["PET_MAX_RESTARTS"])
        return found, "Kubeflow (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_*)"
    if "SLURM_JOB_ID" in env and "SLURM_NODEID" in env:
        nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or ""
        if nodes.isdigit():
            found["num_machines"] = int(nodes)
        if env["SLURM_NODEID"].isdigit():
            found["machine_rank"] = int(env["SLURM_NODEID"])
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodelist:
            found["main_process_ip"] = env.get("MASTER_ADDR") or first_host(nodelist)
        port = env.get("MASTER_PORT", "")
        found["main_process_port"] = int(port) if port.isdigit() else 15000 + _int(env, "SLURM_JOB_ID", 0) % 20000
        return found, "SLURM (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_JOB_ID)"
    return found, ""


# torchrun first: it may itself run under srun or mpirun, and then its variables describe the workers.
# MPI before SLURM: ``mpirun`` inside an sbatch allocation inherits the batch step's SLURM_PROCID=0.
DETECTORS: list[Callable[[Mapping[str, str]], ProcessInfo | None]] = [
    from_torchrun, from_open_mpi, from_mvapich, from_pmi, from_slurm,
]


def detect_process_info(env: Mapping[str, str] | None = None) -> ProcessInfo:
    """The first cluster environment that recognises ``env`` (default: ``os.environ``), else one process."""
    env = os.environ if env is None else env
    for detect in DETECTORS:
        info = detect(env)
        if info is not None:
            check_process_info(info)
            return info
    return ProcessInfo()


def check_process_info(info: ProcessInfo) -> None:
    """Raise at once (instead of waiting for a rendezvous that can never complete) when the rank, world
    size or local rank that the launcher set cannot be right."""
    problems = []
    if info.world_size < 1:
        problems.append(f"the world size is {info.world_size}; it must be at least 1 (the number of processes)")
    elif not 0 <= info.rank < info.world_size:
        problems.append(f"rank {info.rank} is outside the world of {info.world_size} processes; ranks run "
                        f"0..{info.world_size - 1}")
    if info.local_world_size < 1:
        problems.append(f"the local world size is {info.local_world_size}; it must be at least 1")
    elif not 0 <= info.local_rank < info.local_world_size:
        problems.append(f"local rank {info.local_rank} is outside the {info.local_world_size} processes of this "
                        f"machine; local ranks run 0..{info.local_world_size - 1}")
    if not 0 < info.master_port < 65536:
        problems.append(f"the master port {info.master_port} is not a port; give 1-65535")
    if problems:
        raise ValueError(f"this process's place in the job, read from {info.source}, is impossible: "
                         + "; ".join(problems) + ". Check the variables your launcher sets (for torchrun: RANK, "
                         "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_PORT)")
