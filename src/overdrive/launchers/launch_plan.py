"""What ``overdrive launch`` decided, as values: how many processes where and what the workers are told
(``LaunchPlan``), and what each worker runs (``Command``). The command line builds them before anything
starts; ``torchrun.launch_script`` runs them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``overdrive launch`` decided: how many processes where, and what the workers are told."""

    num_processes: int  # in all, over every machine (Accelerate's meaning; elastic: with num_machines machines)
    num_machines: int = 1  # elastic: the most machines
    min_machines: int = -1  # elastic (``--num_machines MIN:MAX``): the fewest machines; -1: num_machines
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_conf: str = ""
    rdzv_id: str = "none"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    num_cpu_threads_per_process: int | None = None
    visible_devices: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES for gpu_ids
    worker_config: dict[str, Any] = field(default_factory=dict)
    log_dir: str | None = None
    tee: str | None = None
    role: str = "default"
    debug: bool = False
    quiet: bool = False

    @property
    def processes_per_machine(self) -> int:
        """The processes torchrun starts on each machine."""
        return self.num_processes // self.num_machines

    def __post_init__(self) -> None:
        if self.min_machines == -1:
            object.__setattr__(self, "min_machines", self.num_machines)


@dataclass(frozen=True)
class Command:
    """What each worker runs: a script (or ``-m`` module, or a program with ``--no_python``) and its args."""

    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    #: run the target with ``import accelerate`` giving overdrive (``overdrive launch --as_accelerate``)
    as_accelerate: bool = False


def default_threads(local_processes: int) -> int:
    """CPU threads per process when none are asked for: this machine's cores shared out, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(cores // max(local_processes, 1), 1)

