"""The device a process computes on, from torch's own accelerator API (no vendor ladder)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def select_device(local_rank: int, cpu: bool = False) -> torch.device:
    """The current accelerator's device for ``local_rank``, or the CPU when asked or when there is none."""
    if cpu or not torch.accelerator.is_available():
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    assert accelerator is not None
    count = torch.accelerator.device_count()
    index = local_rank % count if count else 0
    torch.accelerator.set_device_index(index)
    return torch.device(accelerator.type, index)


def backend_for(device: torch.device) -> str:
    """torch's default process-group backend for the device type: gloo on CPU, NCCL on CUDA, ..."""
    return dist.get_default_backend_for_device(device)
