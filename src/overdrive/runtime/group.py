"""The one source of this process's rank, world size and local rank, and of the default process group.

Once the process group exists these are its answers; before it exists (``set_seed`` is often a script's
first line) they come from the cluster environment the launcher set up (torchrun, SLURM, MPI), read by
``runtime.cluster`` like everything else the launchers say. Without either: one process.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from overdrive.runtime.cluster import ProcessInfo, detect_process_info


def is_initialized() -> bool:
    """Whether the default process group exists."""
    return dist.is_available() and dist.is_initialized()


def is_distributed() -> bool:
    """Whether collectives have other processes to talk to (a process group of more than one)."""
    return is_initialized() and dist.get_world_size() > 1


def rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the whole job); 0 without a process group."""
    return dist.get_rank(group) if is_initialized() else 0


def world_size(group: Any = None) -> int:
    """The processes in ``group`` (default: the whole job); 1 without a process group."""
    return dist.get_world_size(group) if is_initialized() else 1


def process_info() -> ProcessInfo:
    """This process's place in the job as its launcher describes it (valid before the process group
    exists, and on a process that never joins one)."""
    return detect_process_info()


def process_rank() -> int:
    """This process's rank in the job: the process group's, or before it exists the launcher's (torchrun's
    RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, ...)."""
    return dist.get_rank() if is_initialized() else process_info().rank


def local_rank() -> int:
    """This process's index on its machine, as its launcher set it."""
    return process_info().local_rank


def default_group() -> Any:
    """The default process group (``None`` without one: collectives then run on one process)."""
    return dist.group.WORLD if is_initialized() else None


__all__ = ["default_group", "is_distributed", "is_initialized", "local_rank", "process_info", "process_rank",
           "rank", "world_size"]
