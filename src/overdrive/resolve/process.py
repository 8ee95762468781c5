"""The resolver's first step: where this process runs (its place in the job, its device, its backend)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch

from overdrive.config import DistributedType, InitProcessGroupKwargs
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, launch_config
from overdrive.runtime.cluster import ProcessInfo, detect_process_info
from overdrive.runtime.device import backend_for, select_device
from overdrive.runtime.group import is_initialized


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """Where this process runs: its place in the job, its device and the process-group backend."""

    info: ProcessInfo
    device: torch.device
    backend: str | None
    timeout: timedelta | None = None
    debug: bool = False
    #: end the job with every rank's stack when no rank issued a collective for this long (None: off)
    stall_timeout: float | None = None

    @property
    def distributed_type(self) -> DistributedType:
        """How the run is parallel, as Accelerate names it (descriptive only)."""
        if self.info.world_size == 1:
            return DistributedType.NO
        if self.device.type == "cpu":
            return DistributedType.MULTI_CPU
        if self.device.type == "cuda":
            return DistributedType.MULTI_GPU
        try:
            return DistributedType(f"MULTI_{self.device.type.upper()}")
        except ValueError:
            return DistributedType.MULTI_GPU

    def start(self) -> None:
        """Select the device and join the default process group (once per process)."""
        if self.device.type != "cpu" and self.device.index is not None:
            torch.accelerator.set_device_index(self.device.index)
        if self.info.is_distributed:  # one process joins no group (and loads no process-group module)
            # lazy: a one-process run never loads the process group and its watchdog
            from overdrive.runtime.process_group import ensure_process_group

            ensure_process_group(self.info, self.device, self.backend, self.timeout, self.stall_timeout)


def resolve_process(cpu: bool = False, init_kwargs: InitProcessGroupKwargs | None = None) -> ProcessPlan:
    """Where this process runs: its place in the job (torchrun, SLURM, MPI...), its device and backend."""
    launched = launch_config()
    use_cpu = cpu or bool(launched.get("cpu", False))
    info = joined_or_alone(detect_process_info(), use_cpu)
    device = select_device(info.local_rank, cpu=use_cpu)
    if launched.get("torch_device") and not cpu:  # ACCELERATE_TORCH_DEVICE: Accelerate's explicit device
        device = torch.device(launched["torch_device"])
    init_kwargs = init_kwargs or InitProcessGroupKwargs()
    backend = init_kwargs.backend or (backend_for(device) if info.is_distributed else None)
    debug = bool(launched.get("debug", False)) or os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    timeout = init_kwargs.timeout
    if timeout is None and launched.get("timeout"):  # overdrive launch --timeout
        timeout = timedelta(seconds=float(launched["timeout"]))
    stall = float(launched["stall_timeout"]) if launched.get("stall_timeout") else None  # --stall_timeout
    return ProcessPlan(info=info, device=device, backend=backend, timeout=timeout, debug=debug, stall_timeout=stall)


def joined_or_alone(info: ProcessInfo, cpu: bool) -> ProcessInfo:
    """``info``, or one process alone, as Accelerate decides it: on a machine without a GPU (or another
    accelerator), processes started together (torchrun, mpirun, srun) form one CPU world only with the CPU
    setting (``Accelerator(cpu=True)``, ``ACCELERATE_USE_CPU=1``, ``overdrive launch`` on such a machine);
    without it each trains alone, world size 1 (rank 0 of them says so once). A process group the script
    made itself is kept."""
    if not info.is_distributed or cpu or torch.accelerator.is_available() or is_initialized():
        return info
    if info.rank == 0 and LAUNCH_CONFIG_VAR not in os.environ:  # overdrive launch said so in its own line
        print(f"overdrive: warning: {info.world_size} processes were started ({info.source}) on a machine with no GPU, "
              "without the CPU setting: as under Accelerate, each trains alone (world size 1); to train them as one "
              "run on gloo, set ACCELERATE_USE_CPU=1, pass Accelerator(cpu=True), or start them with 'overdrive "
              f"launch --num_processes {info.world_size}'", file=sys.stderr, flush=True)
    return ProcessInfo(source=f"{info.source}, alone: no GPU and no CPU setting")
