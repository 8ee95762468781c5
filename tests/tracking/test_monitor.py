"""Throughput / MFU monitor against hand computations (with an injected clock, so nothing is timed),
the progress bar's log-friendly output, and one Chrome trace per process from ``Accelerator.profile``."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from overdrive.tracking.progress import ProgressBar, progress_bar
from overdrive.tracking.throughput import (
    PEAK_FLOPS,
    ThroughputMonitor,
    estimate_flops_per_token,
    peak_flops_for,
)
from tests.support.distributed import run_distributed


def fake_clock(times: list[float]):
    values = iter(times)
    return lambda: next(values)


# -- throughput ---------------------------------------------------------------------------------------------

def test_throughput_and_mfu_match_a_hand_computation():
    # construction at t=10, then four steps of 8 samples x 128 tokens ending at 10.5, 11, 12, 12.5
    clock = fake_clock([10.0, 10.5, 11.0, 12.0, 12.5])
    monitor = ThroughputMonitor(2, window=3, flops_per_sample=1e9, peak_flops=1e11, clock=clock)
    for _ in range(4):
        monitor.step(samples=8, tokens=8 * 128)
    out = monitor.compute()
    # the window is the last 3 steps: 10.5 -> 12.5 is 2 s; 24 samples here, 48 on the 2 processes
    assert out["step_time"] == pytest.approx(2.0 / 3)
    assert out["samples_per_sec"] == pytest.approx(48 / 2.0)
    assert out["samples_per_sec_per_device"] == pytest.approx(12.0)
    assert out["tokens_per_sec"] == pytest.approx(48 * 128 / 2.0)
    assert out["tokens_per_sec_per_device"] == pytest.approx(24 * 128 / 2.0)
    assert out["flops_per_sec_per_device"] == pytest.approx(12.0 * 1e9)
    assert out["mfu"] == pytest.approx(12e9 / 1e11)
    assert out["total_samples"] == 64 and out["total_tokens"] == 64 * 128 and out["steps"] == 4


def test_flops_per_token_and_the_first_step_counted_from_construction():
    clock = fake_clock([0.0, 4.0, 5.0])
    monitor = ThroughputMonitor(window=10, flops_per_token=600.0, peak_flops=1e6, clock=clock)
    monitor.step(samples=2, tokens=1000)
    monitor.step(samples=2, tokens=1000)
    out = monitor.compute()
    assert out["step_time"] == pytest.approx(2.5)  # (4 + 1) / 2: the first step ran from construction
    assert out["tokens_per_sec"] == pytest.approx(400.0)
    assert out["mfu"] == pytest.approx(400.0 * 600.0 / 1e6)


def test_without_flops_or_peak_the_keys_are_left_out_and_reset_forgets():
    clock = fake_clock([0.0, 1.0, 3.0, 3.5, 4.0])
    monitor = ThroughputMonitor(flops_per_sample=10.0, clock=clock)  # CPU: peak unknown
    monitor.step(samples=4)
    out = monitor.compute()
    assert out["samples_per_sec"] == 4.0 and out["flops_per_sec_per_device"] == 40.0
    assert "mfu" not in out and "tokens_per_sec" not in out
    monitor.reset()  # t = 3.0
    assert monitor.compute() == {"steps": 0.0, "total_samples": 0.0}
    monitor.step(samples=1)  # 3.5
    assert monitor.compute()["step_time"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not both"):
        ThroughputMonitor(flops_per_sample=1.0, flops_per_token=1.0)


def test_estimate_flops_per_token_counts_shared_weights_once_and_reads_config():
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16), nn.Linear(16, 100, bias=False))
    model[2].weight = model[0].weight  # tied input/output embedding
    n_params = 100 * 16 + 16 * 16 + 16
    assert estimate_flops_per_token(model) == 6 * n_params
    assert estimate_flops_per_token(model, exclude_embeddings=True) == 6 * (16 * 16 + 16)
    attention = 12 * 2 * 16 * 32
    assert estimate_flops_per_token(model, 32, num_layers=2, hidden_size=16) == 6 * n_params + attention
    model.config = SimpleNamespace(num_hidden_layers=2, hidden_size=16)  # Hugging Face style
    assert estimate_flops_per_token(model, 32) == 6 * n_params + attention


@pytest.mark.parametrize("name,dtype,peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12), ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H100 NVL", "fp16", 835.3e12), ("NVIDIA H200", "fp32", 66.9e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12), ("NVIDIA A100-PCIE-40GB", "tf32", 156e12),
    ("NVIDIA L40S", "bf16", 362.05e12), ("NVIDIA L4", "bf16", 121e12), ("NVIDIA A10", "fp32", 31.2e12),
    ("Tesla V100-SXM2-16GB", "fp16", 125e12), ("Tesla T4", "fp16", 65e12),
    ("Tesla V100-SXM2-16GB", "bf16", None), ("NVIDIA A10G", "bf16", None), ("cpu", "bf16", None),
])
def test_peak_flops_table_lookup(name, dtype, peak):
    assert peak_flops_for(name, dtype) == peak


def test_peak_table_is_dense_and_ordered():
    for key, peaks in PEAK_FLOPS.items():
        if "bf16" in peaks and "fp32" in peaks:
            assert peaks["bf16"] > peaks["fp32"], key


# -- progress bar -----------------------------------------------------------------------------------------------

def test_progress_bar_in_a_log_file_prints_few_plain_lines():
    out = io.StringIO()  # not a TTY
    ticks = iter(range(10_000))
    bar = ProgressBar(range(1000), desc="train", file=out, process_index=0, min_interval=1e9,
                      percent_step=10, clock=lambda: float(next(ticks)))
    total = 0
    for i in bar:
        total += i
        if i == 500:
            bar.set_postfix(loss=0.125)
    text = out.getvalue()
    lines = text.splitlines()
    assert total == sum(range(1000))
    assert "\r" not in text
    assert len(lines) == 10  # one per 10 %, the last at 100 %, no repeat on close
    assert lines[0].startswith("train: 100/1000 (10%)") and lines[-1].startswith("train: 1000/1000 (100%)")
    assert "loss=0.125" in lines[-1] and "loss" not in lines[3]


def test_progress_bar_time_lines_without_total_and_silent_on_other_ranks():
    out = io.StringIO()
    now = [0.0]
    bar = progress_bar(total=None, desc="eval", file=out, process_index=0, min_interval=5.0, clock=lambda: now[0])
    for _ in range(100):
        now[0] += 0.5  # 50 s in all: a line every 5 s at most
        bar.update()
    bar.close()
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11 and lines[-1].startswith("eval: 100 it")

    other = io.StringIO()
    with ProgressBar(range(50), file=other, process_index=1) as silent:
        assert list(silent) == list(range(50))  # still iterates
        silent.write("hello")
    assert other.getvalue() == ""
    everyone = io.StringIO()
    ProgressBar(total=3, file=everyone, process_index=1, main_process_only=False).close()
    assert everyone.getvalue() != ""


def test_progress_bar_on_a_terminal_uses_tqdm():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    bar = ProgressBar(total=5, file=out, process_index=0, mininterval=0)
    for _ in range(5):
        bar.update()
    bar.close()
    assert "\r" in out.getvalue() and "5/5" in out.getvalue()


# -- on two processes: reduced throughput and one profiler trace per rank -----------------------------------------

def _monitor_and_profile(trace_dir: str) -> dict:
    from overdrive import Accelerator
    from overdrive.config import ProfileKwargs

    accelerator = Accelerator()
    rank = accelerator.process_index
    # rank 0: 1 s per step, 4 samples; rank 1: 1.5 s per step, 6 samples
    clock = fake_clock([0.0, 1.0, 2.0, 3.0] if rank == 0 else [0.0, 1.5, 3.0, 4.5])
    monitor = ThroughputMonitor(accelerator, window=5, flops_per_sample=100.0, peak_flops=1000.0, clock=clock)
    for _ in range(3):
        monitor.step(samples=4 if rank == 0 else 6, tokens=0)
    figures = monitor.compute()

    with accelerator.profile(ProfileKwargs(output_trace_dir=trace_dir)):
        x = torch.randn(32, 32)
        for _ in range(3):
            x = torch.mm(x, x).tanh()
    accelerator.wait_for_everyone()
    return {"figures": figures, "dtype": monitor.dtype, "world": monitor.world_size}


@pytest.mark.timeout(180)
def test_throughput_is_summed_over_ranks_and_each_rank_writes_a_trace(tmp_path):
    trace_dir = str(tmp_path / "traces")
    results = run_distributed(_monitor_and_profile, 2, trace_dir, timeout=150)
    for result in results:
        figures = result["figures"]
        assert result["world"] == 2 and result["dtype"] in ("fp32", "tf32")
        # 12 + 18 samples over the slower rank's 4.5 s
        assert figures["samples_per_sec"] == pytest.approx(30 / 4.5)
        assert figures["samples_per_sec_per_device"] == pytest.approx(15 / 4.5)
        assert figures["step_time"] == pytest.approx(1.5)
        assert figures["mfu"] == pytest.approx(15 / 4.5 * 100 / 1000)
        assert figures["total_samples"] == 30 and "tokens_per_sec" not in figures
    assert sorted(os.listdir(trace_dir)) == ["trace_rank_0.json", "trace_rank_1.json"]
    for rank in (0, 1):
        with open(os.path.join(trace_dir, f"trace_rank_{rank}.json")) as handle:
            trace = json.load(handle)
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "aten::mm" in names and "aten::tanh" in names
