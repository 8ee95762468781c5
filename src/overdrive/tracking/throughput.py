"""Throughput and model FLOPs utilisation (MFU) of a training loop.

    monitor = ThroughputMonitor(accelerator, window=20, flops_per_token=estimate_flops_per_token(model, 1024))
    for batch in loader:
        ...
        monitor.step(samples=len(batch["input_ids"]), tokens=batch["input_ids"].numel())
        if step % 50 == 0:
            accelerator.log(monitor.compute(), step=step)     # collective: every process calls it

Rates are over the last ``window`` steps and summed over processes; MFU is the model FLOPs achieved per
second over the devices' peak (``peak_flops`` per device, or looked up by device name and precision).
"""

from __future__ import annotations

import collections
import math
import re
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# Dense (no sparsity) peak FLOP/s per device, from the vendors' data sheets, by precision.
# "fp32" is plain fp32; "tf32" is used for fp32 training when torch lets matmuls use TF32.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h100-sxm": {"fp8": 1978.9e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "h100-pcie": {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12},
    "h100-nvl": {"fp8": 1670.5e12, "bf16": 835.3e12, "fp16": 835.3e12, "tf32": 417.6e12, "fp32": 60e12},
    "h200": {"fp8": 1978.9e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "h200-nvl": {"fp8": 1670.5e12, "bf16": 835.3e12, "fp16": 835.3e12, "tf32": 417.6e12, "fp32": 60e12},
    "a100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "a10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
    "l40s": {"fp8": 733e12, "bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12},
    "l4": {"fp8": 242.5e12, "bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "v100-pcie": {"fp16": 112e12, "fp32": 14e12},
    "v100": {"fp16": 125e12, "fp32": 15.7e12},
    "t4": {"fp16": 65e12, "fp32": 8.1e12},
    "mi300x": {"fp8": 2614.9e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12},
}

# (words that must all appear in the device name, table key); the first match wins, specific ones first
_NAME_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h100", "nvl"), "h100-nvl"), (("h100", "pcie"), "h100-pcie"), (("h100",), "h100-sxm"),
    (("gh200",), "h100-sxm"), (("h200", "nvl"), "h200-nvl"), (("h200",), "h200"), (("a100",), "a100"),
    (("a10",), "a10"), (("l40s",), "l40s"), (("l4",), "l4"), (("v100", "pcie"), "v100-pcie"),
    (("v100",), "v100"), (("t4",), "t4"), (("mi300x",), "mi300x"),
)

_PRECISION_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "no": "fp32", "fp32": "fp32", "tf32": "tf32"}


def peak_flops_for(device_name: str, dtype: str = "bf16") -> float | None:
    """The dense peak FLOP/s of the device called ``device_name`` (``torch.cuda.get_device_name()``) in
    ``dtype`` (bf16, fp16, fp8, tf32, fp32), or None when it is not in ``PEAK_FLOPS``."""
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for required, key in _NAME_RULES:
        if all(word in words for word in required):
            return PEAK_FLOPS[key].get(dtype)
    return None


def _fp32_kind() -> str:
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def estimate_flops_per_token(model: nn.Module, seq_len: int | None = None, *, num_layers: int | None = None,
                             hidden_size: int | None = None, exclude_embeddings: bool = False) -> float:
    """Training FLOPs (forward + backward) per token of a transformer: ``6 * n_params`` plus, when the
    sequence length, layer count and hidden size are known, the attention term ``12 * layers * hidden *
    seq_len`` (PaLM, appendix B). Layers and hidden size are read from ``model.config`` (Hugging Face names)
    when not given. ``exclude_embeddings`` leaves out ``nn.Embedding`` weights (lookups, not matmuls)."""
    seen: set[int] = set()
    n_params = 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            n_params += param.numel()
    if exclude_embeddings:
        for module in model.modules():
            if isinstance(module, nn.Embedding) and id(module.weight) in seen:
                seen.discard(id(module.weight))
                n_params -= module.weight.numel()
    config = getattr(model, "config", None)
    if num_layers is None:
        num_layers = _first_attr(config, "num_hidden_layers", "n_layer", "num_layers")
    if hidden_size is None:
        hidden_size = _first_attr(config, "hidden_size", "n_embd", "d_model")
    flops = 6.0 * n_params
    if seq_len and num_layers and hidden_size:
        flops += 12.0 * num_layers * hidden_size * seq_len
    return flops


def _first_attr(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


class ThroughputMonitor:
    """Samples/s, tokens/s, step time and MFU over the last ``window`` steps, for all processes together.

    ``accelerator`` is an ``Accelerator`` (counts are summed over processes with an all-reduce, so
    ``compute()`` must be called on every process), an int world size (no communication: every process is
    assumed to do what this one does), or None (one process). Give ``flops_per_sample`` or
    ``flops_per_token`` (see ``estimate_flops_per_token``) for FLOP/s, and ``peak_flops`` (per device) for
    MFU when the device is not in ``PEAK_FLOPS``; ``dtype`` defaults to the accelerator's precision.
    ``clock`` returns seconds; pass your own to make measurements exact in tests.

    A step's time runs from the previous ``step()`` call (the first from construction or ``reset()``),
    so create the monitor just before the loop.
    """

    def __init__(self, accelerator: Any = None, *, window: int = 50, flops_per_sample: float | None = None,
                 flops_per_token: float | None = None, peak_flops: float | None = None,
                 dtype: str | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        if window < 1:
            raise ValueError(f"ThroughputMonitor: window must be at least 1, got {window}")
        if flops_per_sample is not None and flops_per_token is not None:
            raise ValueError("ThroughputMonitor: give flops_per_sample or flops_per_token, not both")
        self.accelerator = None if isinstance(accelerator, int) else accelerator
        if isinstance(accelerator, int):
            if accelerator < 1:
                raise ValueError(f"ThroughputMonitor: world size must be at least 1, got {accelerator}")
            self.world_size = accelerator
        else:
            self.world_size = 1 if accelerator is None else int(accelerator.num_processes)
        self.window = window
        self.flops_per_sample = flops_per_sample
        self.flops_per_token = flops_per_token
        self.dtype = dtype or self._default_dtype()
        self.peak_flops = peak_flops if peak_flops is not None else self._lookup_peak()
        self.clock = clock
        self.reset()

    def _device(self) -> torch.device:
        if self.accelerator is not None:
            return torch.device(self.accelerator.device)
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _default_dtype(self) -> str:
        precision = getattr(self.accelerator, "mixed_precision", None) or "no"
        dtype = _PRECISION_DTYPES.get(str(precision), "fp32")
        return _fp32_kind() if dtype == "fp32" else dtype

    def _lookup_peak(self) -> float | None:
        device = self._device()
        if device.type != "cuda":
            return None  # CPUs and other devices: pass peak_flops
        return peak_flops_for(torch.cuda.get_device_name(device), self.dtype)

    def reset(self) -> None:
        """Forget every step; the next step's time starts now."""
        self._times: collections.deque[float] = collections.deque([self.clock()], maxlen=self.window + 1)
        self._samples: collections.deque[float] = collections.deque(maxlen=self.window)
        self._tokens: collections.deque[float] = collections.deque(maxlen=self.window)
        self.total_samples = 0.0
        self.total_tokens = 0.0
        self.steps = 0

    def step(self, samples: float = 0, tokens: float = 0) -> None:
        """Mark the end of a step that processed ``samples`` samples and ``tokens`` tokens on this process."""
        self._times.append(self.clock())
        self._samples.append(samples)
        self._tokens.append(tokens)
        self.total_samples += samples
        self.total_tokens += tokens
        self.steps += 1

    def _global(self, counts: list[float], elapsed: float) -> tuple[list[float], float]:
        """Counts summed and elapsed time maxed over processes."""
        if self.accelerator is None or self.world_size == 1:
            return [c * self.world_size for c in counts], elapsed

        if not (dist.is_available() and dist.is_initialized()):
            return [c * self.world_size for c in counts], elapsed
        device = self._device()
        summed = torch.tensor(counts, dtype=torch.float64, device=device)
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return summed.tolist(), float(slowest.item())

    def compute(self) -> dict[str, float]:
        """The figures over the last ``window`` steps: ``step_time`` (s), ``samples_per_sec``,
        ``tokens_per_sec`` (all processes) and their ``*_per_device`` means, ``flops_per_sec_per_device`` and
        ``mfu`` (0-1) when FLOPs and peak are known, and the running totals. Keys that cannot be computed
        are left out. A collective when given an Accelerator with several processes."""
        steps = len(self._samples)
        elapsed = self._times[-1] - self._times[0] if steps else 0.0
        counts = [sum(self._samples), sum(self._tokens), self.total_samples, self.total_tokens]
        (samples, tokens, total_samples, total_tokens), elapsed = self._global(counts, elapsed)
        out: dict[str, float] = {"steps": float(self.steps), "total_samples": total_samples}
        if total_tokens:
            out["total_tokens"] = total_tokens
        if not steps or elapsed <= 0 or not math.isfinite(elapsed):
            return out
        out["step_time"] = elapsed / steps
        out["samples_per_sec"] = samples / elapsed
        out["samples_per_sec_per_device"] = out["samples_per_sec"] / self.world_size
        if total_tokens:
            out["tokens_per_sec"] = tokens / elapsed
            out["tokens_per_sec_per_device"] = out["tokens_per_sec"] / self.world_size
        flops_per_sec = None
        if self.flops_per_sample is not None:
            flops_per_sec = self.flops_per_sample * out["samples_per_sec"]
        elif self.flops_per_token is not None and "tokens_per_sec" in out:
            flops_per_sec = self.flops_per_token * out["tokens_per_sec"]
        if flops_per_sec is not None:
            out["flops_per_sec_per_device"] = flops_per_sec / self.world_size
            if self.peak_flops:
                out["mfu"] = out["flops_per_sec_per_device"] / self.peak_flops
        return out
