"""Compat path: the throughput / MFU monitor lives in ``overdrive.tracking.throughput``."""

from overdrive.tracking.throughput import (
    PEAK_FLOPS,
    ThroughputMonitor,
    estimate_flops_per_token,
    peak_flops_for,
)

__all__ = ["PEAK_FLOPS", "ThroughputMonitor", "estimate_flops_per_token", "peak_flops_for"]
