"""Per-step overhead of the same training loop: plain PyTorch vs overdrive vs Accelerate vs Fabric.

    .venv/bin/python bench/step_overhead.py            # full run, ~3-5 min on 2 CPU cores
    .venv/bin/python bench/step_overhead.py --quick    # ~1 min, noisier
    .venv/bin/python bench/step_overhead.py --steps 50 --rounds 8 --workloads mlp --procs 2
    .venv/bin/python bench/step_overhead.py --compile --workloads transformer   # torch.compile, target x1.01

Two workloads (a tiny MLP, where framework overhead dominates, and a small transformer encoder) in two
settings (1 process; 2 processes of data parallel over gloo on 127.0.0.1). Every process uses one
intra-op thread. Within one setting all contenders are built in the same process(es), each from a fresh
seeded model, optimizer and DataLoader; after warm-up they run in round-robin blocks (one block = one
epoch = ``--steps`` steps, the starting contender rotating each round) so that they share the machine's
conditions. Reported: the median over rounds of each block's time per step, and the median over rounds
of contender/plain within the same round. Accelerate and Fabric rows appear only where they import.
Writes a markdown table to stdout and everything (per-round times included) to bench/results/.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import logging
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from step_loops import LR, build_accelerator_loop, fresh_model, make_data  # noqa: E402 - shared with step_calls.py

CONTENDERS = ("plain", "overdrive", "accelerate", "fabric")
# workload -> (batch per process, steps per round, rounds) for a full run and for --quick
DEFAULTS = {"mlp": ((64, 100, 30), (64, 100, 6)), "transformer": ((16, 10, 20), (16, 5, 4))}
TARGETS = {"mlp": 1.03, "transformer": 1.01}  # overdrive / plain, from the issue


# Each builder returns (run_epoch, raw_model); run_epoch() runs one epoch and returns (steps, last batch size).
def build_plain(workload, data, batch, world, rank, compiled=False):
    model = fresh_model(workload)
    # with --compile: what overdrive's prepare does with dynamo_backend="inductor", by hand
    trained = torch.compile(model) if compiled else model
    trained = DistributedDataParallel(trained) if world > 1 else trained
    optimizer = torch.optim.AdamW(trained.parameters(), lr=LR)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0) if world > 1 else None
    loader = DataLoader(data, batch_size=batch, shuffle=sampler is None, sampler=sampler)
    epoch = [0]

    def run_epoch():
        if sampler is not None:
            sampler.set_epoch(epoch[0])
        epoch[0] += 1
        steps = 0
        for x, y in loader:
            loss = F.cross_entropy(trained(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        return steps, len(x)

    return run_epoch, model


def build_overdrive(workload, data, batch, world, rank, compiled=False):
    from overdrive import Accelerator
    from overdrive.training.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()  # a previous workload's Accelerator in this process
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, dynamo_backend="inductor" if compiled else None)
    return build_accelerator_loop(accelerator, workload, data, batch)


def build_accelerate(workload, data, batch, world, rank, compiled=False):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # clears singletons; keeps the process group
    GradientState._reset_state()
    # cpu=True, as `accelerate launch --cpu` sets: without it Accelerate ignores WORLD_SIZE on a machine
    # without an accelerator and each process trains alone on the whole data set.
    return build_accelerator_loop(Accelerator(cpu=True), workload, data, batch)


def build_fabric(workload, data, batch, world, rank, compiled=False):
    from lightning.fabric import Fabric

    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto")
    fabric.launch()  # LOCAL_RANK is set, so Fabric starts no processes and reuses the process group
    model = fresh_model(workload)
    wrapped, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=LR))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=batch, shuffle=True))

    def run_epoch():
        steps = 0
        for x, y in loader:
            loss = F.cross_entropy(wrapped(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        return steps, len(x)

    return run_epoch, model


BUILDERS = {"plain": build_plain, "overdrive": build_overdrive, "accelerate": build_accelerate, "fabric": build_fabric}


def _agree(names: list[str], world: int) -> list[str]:
    """The contenders that built on every rank (a rank that failed must not run collectives)."""
    if world == 1:
        return names
    everyone: list[list[str]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, names)
    return [n for n in names if all(n in other for other in everyone)]


def _in_sync(model: nn.Module, world: int) -> bool:
    """Whether the weights are identical on every rank after training (i.e. gradients were averaged)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    if world == 1:
        return True
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def run_workload(workload: str, cfg: dict, world: int, rank: int) -> dict:
    batch, steps, rounds = cfg["plan"][workload]
    data = make_data(workload, steps * batch * world)
    runners, models, errors = {}, {}, {}
    for name in cfg["contenders"]:
        try:
            extra = {"compiled": True} if cfg.get("compile") else {}
            runners[name], models[name] = BUILDERS[name](workload, data, batch, world, rank, **extra)
        except Exception as exc:  # a contender that is not installed or not finished yet
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    names = _agree(list(runners), world)
    torch.set_num_threads(1)  # in case a framework changed it
    shapes = {name: runners[name]() for name in names}  # one untimed warm-up epoch each
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            gc.collect()
            if world > 1:
                dist.barrier()
            assert torch.get_num_threads() == 1, torch.get_num_threads()
            start, start_cpu = time.perf_counter(), time.process_time()
            done, _ = runners[name]()
            times[name].append((time.perf_counter() - start) / done)
            cpu[name].append((time.process_time() - start_cpu) / done)
    results = {name: {"per_round_s": times[name], "per_round_cpu_s": cpu[name], "steps_and_last_batch": shapes[name],
                      "weights_equal_across_ranks": _in_sync(models[name], world)} for name in names}
    return {"batch_per_process": batch, "steps_per_round": steps, "rounds": rounds, "errors": errors,
            "contenders": results}


def worker(rank: int, world: int, port: int, cfg: dict, out_path: str) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
    results = {w: run_workload(w, cfg, world, rank) for w in cfg["workloads"]}
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_setting(world: int, cfg: dict, limit_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.json")
        ctx = mp.start_processes(worker, args=(world, free_port(), cfg, out_path), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + limit_s
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"{world}-process run took over {limit_s:.0f} s")
        return json.loads(Path(out_path).read_text())


def _q(values: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return q1, med, q3


def _median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free ~95% confidence interval of the median (order statistics, normal approximation)."""
    ordered, n = sorted(values), len(values)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def summarize(workload: str, world: int, res: dict) -> list[dict]:
    rows, plain = [], res["contenders"].get("plain", {}).get("per_round_s")
    for name, c in res["contenders"].items():
        q1, med, q3 = _q(c["per_round_s"])
        reference = res["contenders"].get("plain", c)["steps_and_last_batch"]
        row = {"workload": workload, "processes": world, "contender": name, "median_ms": med * 1e3,
               "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3, "steps_and_last_batch": c["steps_and_last_batch"],
               # same steps per epoch and batch per process as plain, and the same weights on every rank
               "same_work": c["steps_and_last_batch"] == reference and c["weights_equal_across_ranks"]}
        if plain:
            ratios = [a / b for a, b in zip(c["per_round_s"], plain)]
            row["ratio_q1"], row["ratio"], row["ratio_q3"] = _q(ratios)
            row["ratio_ci_low"], row["ratio_ci_high"] = _median_ci(ratios)
            row["extra_us"] = (med - statistics.median(plain)) * 1e6
            plain_cpu = res["contenders"]["plain"]["per_round_cpu_s"]
            row["cpu_ratio"] = statistics.median(a / b for a, b in zip(c["per_round_cpu_s"], plain_cpu))
        rows.append(row)
    rows += [{"workload": workload, "processes": world, "contender": n, "error": e} for n, e in res["errors"].items()]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| workload | processes | contender | ms/step (median) | IQR ms | vs plain (median [95% CI]) | "
             "vs plain, CPU time | extra µs/step | target |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['workload']} | {r['processes']} | {r['contender']} |"
        if "error" in r:
            lines.append(f"{head} not run: {r['error'][:120]} | | | | | |")
            continue
        target = TARGETS[r["workload"]] if r["contender"] == "overdrive" else None
        verdict = ""
        if target is not None:  # judged on the confidence interval of the median ratio
            met, missed = r["ratio_ci_high"] <= target, r["ratio_ci_low"] > target
            verdict = f"<= {target:.2f}: {'met' if met else 'MISSED' if missed else 'not resolved (CI spans it)'}"
        flag = "" if r["same_work"] else " (NOT the same work as plain!)"
        lines.append(f"{head} {r['median_ms']:.3f}{flag} | {r['q1_ms']:.3f}-{r['q3_ms']:.3f} | "
                     f"{r['ratio']:.3f} [{r['ratio_ci_low']:.3f}-{r['ratio_ci_high']:.3f}] | {r['cpu_ratio']:.3f} | "
                     f"{r['extra_us']:+.0f} | {verdict} |")
    return "\n".join(lines)


def _version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps (~1 min)")
    parser.add_argument("--steps", type=int, help="steps per round (one epoch) for every workload")
    parser.add_argument("--rounds", type=int, help="timed rounds per contender")
    parser.add_argument("--workloads", nargs="+", default=list(DEFAULTS), choices=list(DEFAULTS))
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--out", help="JSON path (default bench/results/step_overhead[_compile][_quick].json)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile (inductor): plain compiles by hand, overdrive with dynamo_backend")
    args = parser.parse_args()
    if args.compile and set(args.contenders) - {"plain", "overdrive"}:
        args.contenders = ["plain", "overdrive"]  # Accelerate and Fabric compile in their own ways
    contenders = ["plain"] + [c for c in args.contenders if c != "plain"]  # plain is the reference
    plan = {w: (d[0], args.steps or d[1], args.rounds or d[2]) for w in args.workloads
            for d in [DEFAULTS[w][1 if args.quick else 0]]}
    cfg = {"plan": plan, "workloads": args.workloads, "contenders": contenders, "compile": args.compile}
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the workers; stops Fabric/Accelerate from raising it
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    rows, raw = [], {}
    for world in args.procs:
        t0 = time.monotonic()
        results = raw[f"{world} process(es)"] = run_setting(world, cfg, limit_s=900)
        print(f"[{world} process(es): {time.monotonic() - t0:.0f} s]", file=sys.stderr)
        for w in args.workloads:
            rows += summarize(w, world, results[w])
    md = table(rows)
    print(md)
    versions = {d: _version(d) for d in ("torch", "overdrive", "accelerate", "lightning")}
    versions["python"] = platform.python_version()
    git = ["git", "-C", str(Path(__file__).parent)]  # which overdrive was measured (src/ changes often)
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "../src"], capture_output=True, text=True).stdout
    versions["overdrive_source"] = f"{commit or 'unknown'}{' + uncommitted changes in src/' if dirty else ''}"
    meta = {"date": started.isoformat(timespec="seconds"), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "threads_per_process": 1, "versions": versions, "config": cfg, "load_avg_start_end": [load0, os.getloadavg()]}
    name = f"step_overhead{'_compile' if args.compile else ''}{'_quick' if args.quick else ''}.json"
    out = Path(args.out or Path(__file__).parent / "results" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows, "markdown": md, "raw": raw}, indent=1))
    print(f"\nwritten to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
