"""Per-micro-batch cost of overdrive's loop over plain PyTorch: function calls (exact) and time (ratio).

    .venv/bin/python bench/step_calls.py               # ~2 min on 2 CPU cores
    .venv/bin/python bench/step_calls.py --rounds 10   # quicker, noisier timing (the call counts are exact)

The tiny MLP of step_overhead.py (1 process, 1 thread, batch 64, 100 micro-batches an epoch) in three modes,
each written twice, as a user writes it:

- fp32: plain ``loss.backward(); opt.step(); opt.zero_grad()`` / overdrive ``with accelerator.accumulate(model)``
  + ``accelerator.backward`` on every batch;
- accumulate(4): plain divides the loss by 4 and steps every 4th batch / ``gradient_accumulation_steps=4``;
- bf16: plain runs the forward in ``torch.autocast("cpu", bfloat16)`` / ``mixed_precision="bf16"``.

Calls are counted with ``sys.setprofile`` over one epoch: Python function calls ("call" events) and calls of
C functions ("c_call"); their sum is what cProfile counts (each side's count includes the one generator resume
per micro-batch through which the bench drives its loop).

Time: after a warm-up epoch each, every round runs one epoch of both loops *interleaved micro-batch by
micro-batch* (plain, overdrive, overdrive, plain, ...: the order flips at each micro-batch and each round), each
micro-batch timed with ``perf_counter``; a round's ratio is overdrive's total over plain's. Pairs ~1 ms apart
see the same machine, so what a shared host does over tens of milliseconds (seen here: one epoch of 100
micro-batches varying by +-30% from round to round at load 1) cancels; ``--blocks`` times whole epochs in
turn instead (the earlier method). Reported: the median ratio over rounds with a distribution-free 95%
confidence interval. Targets (issue 15): at most +10 calls per micro-batch and x1.01. Writes
bench/results/step_calls.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from interleave import interleaved_round  # noqa: E402
from step_loops import LR, build_accelerator_loop, fresh_model, make_data, warmup  # noqa: E402 - step_overhead's MLP and loop

BATCH, STEPS = 64, 100
MODES = {"fp32": {}, "accumulate(4)": {"gradient_accumulation_steps": 4}, "bf16": {"mixed_precision": "bf16"}}
TARGET_CALLS, TARGET_RATIO = 10, 1.01


def plain_loop(mode: str, data: TensorDataset, scheduler: bool = False):
    model = fresh_model("mlp")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup) if scheduler else None
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    every = MODES[mode].get("gradient_accumulation_steps", 1)
    autocast = mode == "bf16"

    def micro_batches():
        for i, (x, y) in enumerate(loader, 1):
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                loss = F.cross_entropy(out.float(), y)
            else:
                loss = F.cross_entropy(model(x), y)
            (loss / every if every > 1 else loss).backward()
            if i % every == 0:
                optimizer.step()
                if lr_scheduler is not None:
                    lr_scheduler.step()
                optimizer.zero_grad()
            yield x.shape[0]

    return micro_batches


def overdrive_loop(mode: str, data: TensorDataset, scheduler: bool = False):
    from overdrive import Accelerator
    from overdrive.training.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return build_accelerator_loop(Accelerator(cpu=True, **MODES[mode]), "mlp", data, BATCH, micro_batches=True,
                                  scheduler=scheduler)[0]


def run_epoch(micro_batches) -> tuple[int, int]:
    """One epoch of a loop given as a generator function: (micro-batches, last batch size)."""
    steps = last = 0
    for last in micro_batches():  # noqa: B007 - the last batch's size is returned
        steps += 1
    return steps, last


def count_calls(micro_batches) -> tuple[Counter, int]:
    """(calls by kind, micro-batches) over one epoch, after a warm-up epoch."""
    run_epoch(micro_batches)
    counts: Counter = Counter()
    sites: Counter = Counter()

    def profiler(frame, event, arg):
        if event in ("call", "c_call"):
            counts[event] += 1
            if event == "call":
                code = frame.f_code
                sites[f"{code.co_filename.split('site-packages/')[-1].split('src/')[-1]}:{code.co_name}"] += 1

    sys.setprofile(profiler)
    try:
        steps, _ = run_epoch(micro_batches)
    finally:
        sys.setprofile(None)
    counts["sites"] = sites  # type: ignore[assignment]
    return counts, steps


def _median_ci(values: list[float]) -> tuple[float, float]:
    ordered, n = sorted(values), len(values)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def _summary(times: dict[str, list[float]], ratios: list[float], cpu_ratio: float | None) -> dict:
    low, high = _median_ci(ratios)
    return {"plain_us": statistics.median(times["plain"]) * 1e6, "overdrive_us": statistics.median(times["overdrive"]) * 1e6,
            "ratio": statistics.median(ratios), "ci": [low, high], "cpu_ratio": cpu_ratio, "per_round_s": times}


def time_interleaved(plain, mine, rounds: int) -> dict:
    """Each round: one epoch of both loops, interleaved and timed micro-batch by micro-batch (interleave.py)."""
    run_epoch(plain), run_epoch(mine)
    times: dict[str, list[float]] = {"plain": [], "overdrive": []}
    for r in range(rounds):
        gc.collect()
        spent, steps = interleaved_round({"plain": plain, "overdrive": mine},
                                         ["plain", "overdrive"] if r % 2 == 0 else ["overdrive", "plain"])
        for name, total in spent.items():
            times[name].append(total / steps)
    ratios = [a / b for a, b in zip(times["overdrive"], times["plain"])]
    return _summary(times, ratios, None)


def time_blocks(plain, mine, rounds: int) -> dict:
    """Each round: one whole epoch of each loop in turn (the order alternating by round)."""
    pairs = {"plain": plain, "overdrive": mine}
    times: dict[str, list[float]] = {name: [] for name in pairs}
    cpu: dict[str, list[float]] = {name: [] for name in pairs}
    for micro_batches in pairs.values():
        run_epoch(micro_batches)
    for r in range(rounds):
        for name in (("plain", "overdrive") if r % 2 == 0 else ("overdrive", "plain")):
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            steps, _ = run_epoch(pairs[name])
            times[name].append((time.perf_counter() - start) / steps)
            cpu[name].append((time.process_time() - start_cpu) / steps)
    ratios = [a / b for a, b in zip(times["overdrive"], times["plain"])]
    return _summary(times, ratios, statistics.median(a / b for a, b in zip(cpu["overdrive"], cpu["plain"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--sites", action="store_true", help="list the extra Python calls by function")
    parser.add_argument("--control", action="store_true",
                        help="add an A/A row: the plain fp32 loop timed against a second copy of itself")
    parser.add_argument("--blocks", action="store_true",
                        help="time whole epochs in turn instead of interleaving the loops micro-batch by micro-batch")
    parser.add_argument("--scheduler", action="store_true",
                        help="both loops step a LambdaLR scheduler (overdrive's prepared, after every micro-batch)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = make_data("mlp", STEPS * BATCH)
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    rows = []
    print("| mode | Python calls / micro-batch: plain | overdrive | extra (target <= +10) | all calls incl. C: "
          "extra | time / micro-batch plain µs | overdrive/plain [95% CI] | CPU time ratio | x1.01 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        plain, mine = plain_loop(mode, data, args.scheduler), overdrive_loop(mode, data, args.scheduler)
        plain_calls, steps = count_calls(plain)
        my_calls, my_steps = count_calls(mine)
        assert steps == my_steps == STEPS, (steps, my_steps)
        py = (plain_calls["call"] / steps, my_calls["call"] / steps)
        every = (plain_calls["call"] + plain_calls["c_call"]) / steps, (my_calls["call"] + my_calls["c_call"]) / steps
        timing = (time_blocks if args.blocks else time_interleaved)(plain, mine, args.rounds)
        low, high = timing["ci"]
        verdict = "met" if high <= TARGET_RATIO else "MISSED" if low > TARGET_RATIO else "not resolved (CI spans it)"
        extra = py[1] - py[0]
        print(f"| {mode} | {py[0]:.1f} | {py[1]:.1f} | {extra:+.1f} ({'met' if extra <= TARGET_CALLS else 'MISSED'}) | "
              f"{every[1] - every[0]:+.1f} | {timing['plain_us']:.1f} | {timing['ratio']:.3f} [{low:.3f}-{high:.3f}] | "
              f"{'-' if timing['cpu_ratio'] is None else format(timing['cpu_ratio'], '.3f')} | {verdict} |")
        if args.sites:
            mine_sites, plain_sites = my_calls["sites"], plain_calls["sites"]
            signed = {k: mine_sites[k] - plain_sites[k] for k in set(mine_sites) | set(plain_sites)}
            for site, n in sorted(signed.items(), key=lambda kv: -abs(kv[1]))[:24]:
                if abs(n) >= steps / 4:
                    print(f"    {n / steps:+6.2f}  {site}")
        rows.append({"mode": mode, "python_calls": py, "all_calls": every, **timing})
    if args.control:  # an A/A row: the same plain fp32 loop against a second copy of itself
        timing = (time_blocks if args.blocks else time_interleaved)(plain_loop("fp32", data), plain_loop("fp32", data),
                                                                      args.rounds)
        low, high = timing["ci"]
        print(f"| control: plain fp32 against itself | | | | | {timing['plain_us']:.1f} | "
              f"{timing['ratio']:.3f} [{low:.3f}-{high:.3f}] | | (the method's resolution) |")
        rows.append({"mode": "control (plain fp32 vs plain fp32)", **timing})
    name = "step_calls" + ("_blocks" if args.blocks else "") + ("_scheduler" if args.scheduler else "")
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "commit": commit,
                               "load_avg_start_end": [load0, os.getloadavg()], "rounds": args.rounds,
                               "timing": "blocks" if args.blocks else "interleaved", "scheduler": args.scheduler,
                               "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
