"""The prepared data loader alone against a plain DataLoader (with a DistributedSampler on 2 processes).

    .venv/bin/python bench/loader_overhead.py              # 1 and 2 processes, 30 rounds: ~2 min on 2 cores
    .venv/bin/python bench/loader_overhead.py --procs 2 --rounds 60
    .venv/bin/python bench/loader_overhead.py --no-contenders --control --seedable --rounds 100  # issue 25's row

Each round iterates one epoch (100 batches of 64 samples of a shuffled ``TensorDataset``, no workers, one
intra-op thread) and does nothing with the batches, so the loader's own cost is all there is. With 2
processes both ranks iterate at once (a gloo group exists, as in training; neither loader communicates
while iterating); rank 0's times are reported. After a warm-up epoch each, every round runs one epoch of all
the loaders interleaved batch by batch (each ``iter()`` and ``next()`` timed with ``perf_counter``, the order
reversed at each batch, a new random order each round: ``interleave.round_order``), so that what a shared host does over tens of milliseconds
falls on both alike; ``--blocks`` instead times whole epochs in turn (ABBA), with CPU time too (the earlier
method). Reported: the median time per batch, the median of prepared/plain per round with a distribution-free
95% confidence interval (and with ``--blocks`` the same ratio on CPU time). Target (issue 15): x1.005. Accelerate's
``prepare_data_loader`` and Lightning Fabric's ``setup_dataloaders`` run as contenders where they import.
Writes bench/results/loader_overhead.json.

``--instructions`` (for a shared machine, where the timings cannot resolve 0.5%) counts instead, with valgrind's
cachegrind (cache simulation off), the user-space instructions of one process that builds the loaders as rank 0
of 2 (``num_processes``/``process_index`` given, no group: no loader communicates while iterating), runs a
warm-up epoch of each, then ``N`` epochs of one of them; a loader's instructions per batch are the difference
between two such runs (1 and 21 epochs by default) over the batches between. ``plain (control)`` (a second
plain loader) shows the method's resolution. ~2 min a run on 2 busy cores; 8 runs. Writes
bench/results/loader_overhead_instructions.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from interleave import interleaved_round, round_order  # noqa: E402

BATCH, STEPS, TARGET = 64, 100, 1.005


def median_ci(values: list[float]) -> tuple[float, float]:
    ordered, n = sorted(values), len(values)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def loaders(world: int, rank: int) -> dict:
    from overdrive.data import prepare_data_loader

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(STEPS * BATCH * world, 32, generator=g),
                         torch.randint(0, 10, (STEPS * BATCH * world,), generator=g))
    if world > 1:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
        plain = DataLoader(data, batch_size=BATCH, sampler=sampler)
    else:
        sampler, plain = None, DataLoader(data, batch_size=BATCH, shuffle=True)
    prepared = prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True), num_processes=world,
                                   process_index=rank, put_on_device=True, device=torch.device("cpu"))
    epoch = [0]
    seedable = {}
    if os.environ.get("LOADER_BENCH_SEEDABLE") == "1":  # the opt-in sampler (exact resume's), as its own row
        loader = prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True), num_processes=world,
                                     process_index=rank, put_on_device=True, device=torch.device("cpu"),
                                     use_seedable_sampler=True)
        seedable["prepared (seedable)"] = lambda: iter(loader)
    contenders = os.environ.get("LOADER_BENCH_CONTENDERS", "1") == "1"
    others = seedable | (_contenders(data, world, rank) if contenders else {})

    def plain_epoch() -> Iterator:
        if sampler is not None:
            sampler.set_epoch(epoch[0])  # what a plain distributed loop does each epoch
        epoch[0] += 1
        return iter(plain)

    if os.environ.get("LOADER_BENCH_CONTROL") == "1":  # an A/A contender: a second plain loader
        again = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=True, seed=0)) if world > 1 else \
            DataLoader(data, batch_size=BATCH, shuffle=True)

        def again_epoch() -> Iterator:
            if world > 1:
                again.sampler.set_epoch(epoch[0])  # pyright: ignore[reportAttributeAccessIssue]
            return iter(again)

        others["plain (control)"] = again_epoch
    return {"plain": plain_epoch, "prepared": lambda: iter(prepared), **others}


def _contenders(data: TensorDataset, world: int, rank: int) -> dict:
    """Accelerate's and Lightning Fabric's prepared loaders, where they import (each over the same data)."""
    found = {}
    try:
        from accelerate.data_loader import prepare_data_loader as accelerate_prepare

        loader = accelerate_prepare(DataLoader(data, batch_size=BATCH, shuffle=True), torch.device("cpu"),
                                    num_processes=world, process_index=rank, put_on_device=True)
        found["accelerate"] = lambda: iter(loader)
    except ImportError:
        pass
    try:
        import logging

        from lightning.fabric import Fabric

        logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
        fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto")
        fabric.launch()  # the group exists: Fabric starts nothing
        fabric_loader = fabric.setup_dataloaders(DataLoader(data, batch_size=BATCH, shuffle=True))
        found["fabric"] = lambda: iter(fabric_loader)
    except ImportError:
        pass
    return found


def _epoch(start: Callable[[], Iterator]) -> int:
    """One whole epoch of the loader that ``start`` begins; its number of batches."""
    n = 0
    for _ in start():
        n += 1
    return n


def worker(rank: int, world: int, port: int, rounds: int, out_path: str, blocks: bool = False) -> None:
    torch.set_num_threads(1)
    if world > 1:  # the variables torchrun sets: Fabric then joins this group instead of starting processes
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
    runs = loaders(world, rank)
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    counts = {name: _epoch(run) for name, run in runs.items()}  # warm-up epoch; same number of batches
    names = list(runs)
    for r in range(rounds):
        order = round_order(names, r)
        if not blocks:
            gc.collect()
            if world > 1:
                dist.barrier()
            for name, seconds in interleaved_round(runs, order)[0].items():
                wall[name].append(seconds / counts[name])
            continue
        for name in order:
            gc.collect()
            if world > 1:
                dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            n = _epoch(runs[name])
            wall[name].append((time.perf_counter() - start) / n)
            cpu[name].append((time.process_time() - start_cpu) / n)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"wall": wall, "cpu": cpu, "batches": counts}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


COUNT_CHILD = "LOADER_BENCH_COUNT"  # "name epochs": this process is the one valgrind counts


def count_child(name: str, epochs: int) -> None:
    """Build the loaders as rank 0 of 2 (no group), one warm-up epoch of each, then ``epochs`` of ``name``."""
    torch.set_num_threads(1)
    runs = loaders(2, 0)
    for run in runs.values():
        _epoch(run)
    for _ in range(epochs):
        _epoch(runs[name])
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the counts differ only by the epochs


def count_instructions(name: str, epochs: int) -> int:
    """User-space instructions of one :func:`count_child` process under cachegrind."""
    with tempfile.TemporaryDirectory(prefix="overdrive-bench-cachegrind-") as folder:
        out = f"{folder}/cg.out"
        env = {**os.environ, COUNT_CHILD: f"{name}\t{epochs}", "PYTHONHASHSEED": "0"}
        result = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                                 sys.executable, __file__], env=env, capture_output=True, text=True, timeout=3600)
        summary = [line for line in Path(out).read_text().splitlines() if line.startswith("summary:")] \
            if result.returncode == 0 and Path(out).exists() else []
        if not summary:
            raise RuntimeError(f"{name} under valgrind failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return int(summary[0].split()[1])


def instruction_rows(epochs: tuple[int, int]) -> dict:
    names = ["plain", "prepared", "prepared (seedable)", "plain (control)"]
    counts = {name: [count_instructions(name, n) for n in epochs] for name in names}
    batches = (epochs[1] - epochs[0]) * STEPS
    per_batch = {name: (high - low) / batches for name, (low, high) in counts.items()}
    return {name: {"counts": counts[name], "per_batch": per_batch[name],
                   "ratio": per_batch[name] / per_batch["plain"]} for name in names}


def run_setting(world: int, rounds: int, blocks: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        out = os.path.join(tmp, "out.json")
        mp.start_processes(worker, args=(world, port, rounds, out, blocks), nprocs=world, join=True, start_method="spawn")
        raw = json.loads(Path(out).read_text())
    rows = {}
    for name in raw["wall"]:
        ratios = [a / b for a, b in zip(raw["wall"][name], raw["wall"]["plain"])]
        cpu_ratios = [a / b for a, b in zip(raw["cpu"][name], raw["cpu"]["plain"])]
        rows[name] = {"ratio": statistics.median(ratios), "ratio_ci": median_ci(ratios),
                      "cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
                      "cpu_ratio_ci": median_ci(cpu_ratios) if cpu_ratios else None,
                      "us": statistics.median(raw["wall"][name]) * 1e6, "batches": raw["batches"][name]}
    return {**raw, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--no-contenders", action="store_true", help="only plain and overdrive's loader")
    parser.add_argument("--control", action="store_true",
                        help="add an A/A contender: a second plain loader, which shows the method's resolution")
    parser.add_argument("--seedable", action="store_true",
                        help="add a row for the prepared loader with use_seedable_sampler=True (the default keeps "
                             "the user's sampler)")
    parser.add_argument("--blocks", action="store_true",
                        help="time whole epochs in turn (wall and CPU) instead of interleaving the loaders batch by batch")
    parser.add_argument("--instructions", nargs="*", type=int, metavar="EPOCHS",
                        help="count instructions per batch with valgrind instead of timing (two epoch counts, "
                             "default 1 21); one process as rank 0 of 2, every loader but the contenders")
    args = parser.parse_args()
    if args.instructions is not None:
        main_instructions(tuple(args.instructions or (1, 21)))
        return
    os.environ["LOADER_BENCH_CONTENDERS"] = "0" if args.no_contenders else "1"  # read by the spawned workers
    os.environ["LOADER_BENCH_CONTROL"] = "1" if args.control else "0"
    os.environ["LOADER_BENCH_SEEDABLE"] = "1" if args.seedable else "0"
    os.environ["OMP_NUM_THREADS"] = "1"
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    results = {world: run_setting(world, args.rounds, args.blocks) for world in args.procs}
    print("| processes | loader | µs/batch (median) | / plain [95% CI] | CPU time / plain [95% CI] | target x1.005 |\n"
          "|---|---|---|---|---|---|")
    for world, result in results.items():
        for name, r in result["rows"].items():
            (low, high) = r["ratio_ci"]
            verdict = f"wall: {'met' if high <= TARGET else 'MISSED' if low > TARGET else 'not resolved (CI spans it)'}"
            cpu = "-"
            if r["cpu_ratio"] is not None:
                clow, chigh = r["cpu_ratio_ci"]
                cpu = f"{r['cpu_ratio']:.3f} [{clow:.3f}-{chigh:.3f}]"
                verdict += f", CPU: {'met' if chigh <= TARGET else 'MISSED' if clow > TARGET else 'not resolved'}"
            print(f"| {world} | {name} | {r['us']:.1f} | {r['ratio']:.3f} [{low:.3f}-{high:.3f}] | {cpu} | "
                  f"{verdict if name.startswith('prepared') else ''} |")
    out = Path(__file__).parent / "results" / ("loader_overhead_blocks.json" if args.blocks else "loader_overhead.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "commit": commit, "rounds": args.rounds,
                               "timing": "blocks" if args.blocks else "interleaved", "load_avg_start_end": [load0, os.getloadavg()], "results": results}, indent=1))


def main_instructions(epochs: tuple[int, ...]) -> None:
    if len(epochs) != 2 or not 0 <= epochs[0] < epochs[1]:
        raise SystemExit(f"--instructions {' '.join(map(str, epochs))}: give two epoch counts, the first smaller "
                         "(e.g. --instructions 1 21)")
    os.environ.update(LOADER_BENCH_CONTENDERS="0", LOADER_BENCH_CONTROL="1", LOADER_BENCH_SEEDABLE="1",
                      OMP_NUM_THREADS="1")
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    rows = instruction_rows((epochs[0], epochs[1]))
    print(f"| loader | instructions/batch (epochs {epochs[0]}->{epochs[1]}) | / plain | target x1.005 |\n"
          "|---|---|---|---|")
    for name, row in rows.items():
        verdict = ("met" if row["ratio"] <= TARGET else "MISSED") if name.startswith("prepared") else ""
        print(f"| {name} | {row['per_batch']:,.0f} | {row['ratio']:.4f} | {verdict} |")
    out = Path(__file__).parent / "results" / "loader_overhead_instructions.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "commit": commit, "epochs": epochs,
                               "load_avg_start_end": [load0, os.getloadavg()], "rows": rows}, indent=1))


if __name__ == "__main__":
    if os.environ.get(COUNT_CHILD):
        child_name, child_epochs = os.environ[COUNT_CHILD].split("\t")
        count_child(child_name, int(child_epochs))
    else:
        main()
