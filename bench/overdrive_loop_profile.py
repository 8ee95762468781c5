"""Where overdrive's per-step overhead goes, on the tiny-MLP loop of step_overhead.py (1 process, 1 thread).

    .venv/bin/python bench/overdrive_loop_profile.py             # ~1.5 min
    .venv/bin/python bench/overdrive_loop_profile.py --rounds 20  # quicker, noisier

Two views:
1. cProfile of the prepared loop: the overdrive functions by cumulative time per step, and the extra
   Python calls per step over the plain loop (profiling inflates times; the ranking is what counts).
2. An ablation without a profiler: the prepared loop with pieces of overdrive taken out (only the
   loader prepared, only model and optimizer, without ``accumulate``, with ``loss.backward()``; nothing in
   src/ changes), run interleaved with the plain loop. The median paired difference to plain per step says what each
   piece costs where it runs. CPU time (process_time) is shown beside wall time: it is less disturbed by
   other work on the machine.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402  (the same model, data and loops as the benchmark)

BATCH, STEPS = 64, 100


def call_counts(run) -> tuple[Counter, Counter]:
    """Calls per step and profiled cumulative µs per step, by function."""
    run()
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    calls, cumulative = Counter(), Counter()
    for (path, line, name), (_, ncalls, _, cum, *_) in pstats.Stats(profile).stats.items():
        key = f"{path.split('site-packages/')[-1].split('src/')[-1]}:{line}({name})"
        calls[key] += ncalls / STEPS
        cumulative[key] += cum / STEPS * 1e6
    return calls, cumulative


def profile_view(data) -> None:
    plain, _ = so.build_plain("mlp", data, BATCH, 1, 0)
    prepared, _ = so.build_overdrive("mlp", data, BATCH, 1, 0)
    plain_calls, _ = call_counts(plain)
    calls, cumulative = call_counts(prepared)
    print(f"Python calls per step: plain {sum(plain_calls.values()):.0f}, overdrive {sum(calls.values()):.0f}")
    print("\noverdrive functions, cumulative µs per step under cProfile:")
    mine = sorted((k for k in cumulative if k.startswith("overdrive/")), key=lambda k: -cumulative[k])
    for key in mine[:15]:
        print(f"  {cumulative[key]:8.1f} µs  {calls[key]:5.1f} calls  {key}")
    print("\nextra calls per step over the plain loop (>= 1):")
    extra = {k: calls[k] - plain_calls.get(k, 0) for k in calls}
    for key, n in sorted(extra.items(), key=lambda kv: -kv[1])[:25]:
        if n >= 1:
            print(f"  {n:+6.1f}  {key.split('lib/python3')[-1]}")


def ablation_view(data, rounds: int) -> None:
    from overdrive import Accelerator, GradientState

    accelerator = Accelerator(cpu=True)
    runs = {"plain": so.build_plain("mlp", data, BATCH, 1, 0)[0]}

    def variant(name, loader_prepared=True, model_prepared=True, accumulate="context", backward="accelerator"):
        model = so.fresh_model("mlp")
        optimizer = torch.optim.AdamW(model.parameters(), lr=so.LR)
        loader = DataLoader(data, BATCH, shuffle=True)
        if model_prepared:  # the model (DDP-less on 1 process) and the AcceleratedOptimizer
            model, optimizer = accelerator.prepare(model, optimizer)
        if loader_prepared:
            loader = accelerator.prepare(loader)
        backward_fn = accelerator.backward if backward == "accelerator" else torch.Tensor.backward

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            backward_fn(loss)
            optimizer.step()
            optimizer.zero_grad()

        def run():
            for x, y in loader:
                if accumulate == "context":
                    with accelerator.accumulate(model):
                        step(x, y)
                else:
                    if accumulate == "begin_only":
                        accelerator.window.begin(GradientState._progress.active_dataloader,
                                                 GradientState._progress.end_of_dataloader)
                    step(x, y)

        runs[name] = run

    variant("overdrive (as benchmarked)")
    variant("accumulate() -> window.begin()", accumulate="begin_only")
    variant("without accumulate()", accumulate="none")
    variant("without accumulate(), loss.backward()", accumulate="none", backward="plain")
    variant("only the loader prepared", model_prepared=False, accumulate="none", backward="plain")
    variant("only model+optimizer prepared", loader_prepared=False, accumulate="none", backward="plain")
    names = list(runs)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for run in runs.values():
        run()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[name]()
            wall[name].append((time.perf_counter() - start) / STEPS)
            cpu[name].append((time.process_time() - start_cpu) / STEPS)
    print(f"\nablation, {rounds} interleaved rounds of {STEPS} steps; µs per step over plain (median of pairs):")
    print(f"  {'loop':36s} {'wall µs':>8s} {'+wall':>7s} {'+cpu':>7s}")
    for name in names:
        d_wall = statistics.median(a - b for a, b in zip(wall[name], wall["plain"])) * 1e6
        d_cpu = statistics.median(a - b for a, b in zip(cpu[name], cpu["plain"])) * 1e6
        print(f"  {name:36s} {statistics.median(wall[name]) * 1e6:8.1f} {d_wall:+7.1f} {d_cpu:+7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = so.make_data("mlp", STEPS * BATCH)
    profile_view(data)
    ablation_view(data, args.rounds)


if __name__ == "__main__":
    main()
