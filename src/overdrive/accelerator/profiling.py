"""``Accelerator.profile``: torch.profiler with one Chrome trace per process."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from overdrive.config import ProfileKwargs

_ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA, "xpu": ProfilerActivity.XPU,
               "mtia": ProfilerActivity.MTIA, "hpu": getattr(ProfilerActivity, "HPU", None)}


def build_profiler(handler: ProfileKwargs, device: torch.device, process_index: int) -> torch.profiler.profile:
    """A ``torch.profiler.profile`` configured from ``handler``; traces go to ``output_trace_dir``."""
    names = handler.activities or (["cpu"] + ([device.type] if device.type != "cpu" else []))
    unknown = [n for n in names if _ACTIVITIES.get(n) is None]
    if unknown:
        valid = sorted(k for k, v in _ACTIVITIES.items() if v is not None)
        raise ValueError(f"ProfileKwargs.activities has {unknown!r}; valid activities: {valid}")
    schedule = torch.profiler.schedule(**handler.schedule_option) if handler.schedule_option else None
    on_trace_ready = handler.on_trace_ready
    if on_trace_ready is None and handler.output_trace_dir:
        on_trace_ready = _chrome_trace_writer(handler.output_trace_dir, process_index)
    return torch.profiler.profile(
        activities=[_ACTIVITIES[n] for n in names], schedule=schedule, on_trace_ready=on_trace_ready,
        record_shapes=handler.record_shapes, profile_memory=handler.profile_memory,
        with_stack=handler.with_stack, with_flops=handler.with_flops, with_modules=handler.with_modules)


def _chrome_trace_writer(folder: str, process_index: int) -> Any:
    def write(profiler: torch.profiler.profile) -> None:
        os.makedirs(folder, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(folder, f"trace_rank_{process_index}.json"))

    return write
