"""The resolver's first step: where this process runs (its place in the job, its device, its backend)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch

from overdrive.config import DistributedType, InitProcessGroupKwargs
from overdrive.config._frozen import FrozenValue
from overdrive.launchers.protocol import launch_config
from overdrive.runtime.cluster import ProcessInfo, detect_process_info
from overdrive.runtime.device import backend_for, select_device


class ProcessPlan(FrozenValue):
    """Where this process runs: its place in the job, its device and the process-group backend."""

    info: ProcessInfo
    device: torch.device
    backend: str | None
    timeout: timedelta | None
    debug: bool
    #: end the job with every rank's stack when no rank issued a collective for this long (None: off)
    stall_timeout: float | None

    def __init__(self, info: ProcessInfo, device: torch.device, backend: str | None, timeout: timedelta | None = None,
                 debug: bool = False, stall_timeout: float | None = None) -> None:
        self._init(locals())

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
            from overdrive.runtime.process_group import ensure_process_group

            ensure_process_group(self.info, self.device, self.backend, self.timeout, self.stall_timeout)


def resolve_process(cpu: bool = False, init_kwargs: InitProcessGroupKwargs | None = None) -> ProcessPlan:
    """Where this process runs: its place in the job (torchrun, SLURM, MPI...), its device and backend."""
    launched = launch_config()
    info = detect_process_info()
    device = select_device(info.local_rank, cpu=cpu or bool(launched.get("cpu", False)))
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
