"""The cost of fault-tolerant training (``--ft_lighthouse``): its step time against plain DDP over the same
processes, and the time a relaunched replica group takes to heal, by model size. Plain DDP runs with the
same glibc allocator thresholds as the fault-tolerant mode sets for itself on the CPU (``_plain_allocator``).

    .venv/bin/python bench/ft_overhead.py                   # 3 rounds, ~4 min on 2 CPU cores
    .venv/bin/python bench/ft_overhead.py --rounds 5 --heal-sizes 256 1024 2048
    .venv/bin/python bench/ft_overhead.py --fsdp --heal-sizes 1024   # groups of 2 processes with FSDP2
    .venv/bin/python bench/ft_overhead.py --rounds 5 --heal-sizes --parts   # also where the step's time goes
    .venv/bin/python bench/ft_overhead.py --rounds 5 --heal-sizes --bucket-view   # plain DDP with bucket views

Step time: the same loop (an MLP of 4 layers of ``--hidden`` units, AdamW, 64 samples a process a step), run
as ``overdrive launch --num_processes 2`` (plain DDP) and as two launches of one process each joined by a
lighthouse (two replica groups); a sample is rank 0's median step time over ``--steps`` steps after 10 warm-up
steps, the rounds interleaved; with ``--parts`` also the medians of the step's parts (forward, backward,
optimizer step, zero_grad) and of torchft's ``Manager`` calls made in it (their wrappers cost ~1 us a call, in
the fault-tolerant mode only). Heal: group 0 trains, group 1 is launched once group 0 has stepped, and the
time and bytes of its heal are read from its report line. Writes a markdown table to stdout and JSON to
bench/results/ft_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET = 1.05


def worker(hidden: int, steps: int, out: str, parts: bool = False, bucket_view: bool = False) -> None:
    """The benchmark loop (run by each launched process); with ``parts``, each part of the step timed too; with
    ``bucket_view``, DDP's ``gradient_as_bucket_view=True`` asked for (the fault-tolerant mode's default)."""
    import torch

    from overdrive import Accelerator, DistributedDataParallelKwargs

    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, hidden), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handlers = [DistributedDataParallelKwargs(gradient_as_bucket_view=True)] if bucket_view else []
    accelerator = Accelerator(kwargs_handlers=handlers)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    times, marks = [], []
    manager_calls = _time_manager_calls(accelerator) if parts else {}
    for _ in range(steps + 10):
        started = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        forward_done = time.perf_counter()
        accelerator.backward(loss)
        backward_done = time.perf_counter()
        optimizer.step()
        step_done = time.perf_counter()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
        marks.append((started, forward_done, backward_done, step_done, started + times[-1]))
        if os.environ.get("BENCH_STEP_SLEEP"):
            time.sleep(float(os.environ["BENCH_STEP_SLEEP"]))
    if accelerator.is_main_process:
        result = {"median_s": statistics.median(times[10:]), "params": sum(p.numel() for p in model.parameters())}
        if parts:
            names = ("forward", "backward", "optimizer step", "zero_grad")
            result["parts_ms"] = {name: 1e3 * statistics.median(m[i + 1] - m[i] for m in marks[10:])
                                  for i, name in enumerate(names)}
            result["parts_ms"].update({f"Manager.{name} (x{len(t) / len(marks):.0f} a step)": 1e3 * statistics.median(t)
                                       for name, t in manager_calls.items() if t})
        Path(out).write_text(json.dumps(result))


def _time_manager_calls(accelerator: Any) -> dict[str, list[float]]:
    """Wraps the calls of torchft's ``Manager`` a fault-tolerant step makes, recording each call's seconds
    (nothing to wrap in plain DDP)."""
    manager = getattr(accelerator.strategy, "manager", None)
    calls: dict[str, list[float]] = {}
    for name in ("start_quorum", "wait_quorum", "allreduce", "should_commit") if manager is not None else ():
        calls[name] = []
        setattr(manager, name, _timed(getattr(manager, name), calls[name]))
    return calls


def _timed(call: Any, times: list[float]) -> Any:
    """``call``, appending the seconds each call takes to ``times``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - started)

    return timed


def _plain_allocator() -> dict[str, str]:
    """glibc's thresholds that the fault-tolerant mode sets in its processes on the CPU (it keeps freed blocks),
    as the environment that gives them to plain DDP too: the ratio is then torchft's cost, not the allocator's."""
    from overdrive.strategies.fault_tolerant import KEPT_BLOCK_BYTES, KEPT_TOP_BYTES

    return {"MALLOC_MMAP_THRESHOLD_": str(KEPT_BLOCK_BYTES), "MALLOC_TRIM_THRESHOLD_": str(KEPT_TOP_BYTES)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERDRIVE_", "ACCELERATE_", "MASTER_"))}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", RUST_LOG="warn", PYTHONUNBUFFERED="1")
    return env


def _launch(args: list[str], out: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--quiet", "--main_process_port",
               str(_free_port()), *args, __file__, "--worker", *WORKER_ARGS, str(out)]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _lighthouse(min_replicas: int, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "overdrive.cli", "lighthouse", "--min_replicas",
                             str(min_replicas), "--bind", f"127.0.0.1:{port}", "--heartbeat_timeout_ms", "2000"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and "listening" in proc.stdout.readline()
    return proc, f"http://127.0.0.1:{port}"


def _ft_flags(address: str, group: int, fsdp: bool = False) -> list[str]:
    inside = ["--num_processes", "2", "--use_fsdp", "--fsdp_version", "2"] if fsdp else ["--num_processes", "1"]
    return [*inside, "--ft_lighthouse", address, "--ft_replica_group", str(group), "--ft_num_replica_groups", "2"]


def step_time(fault_tolerant: bool, folder: Path, fsdp: bool = False) -> dict[str, Any]:
    """Rank 0's result of one run: ``median_s``, its median step time (s), and with ``--parts`` ``parts_ms`` (with ``fsdp``: plain HSDP over 4 processes, 2 replicas of 2
    shards, or 2 groups of 2 processes sharding with FSDP2)."""
    env, out = _env(), folder / f"result_{time.monotonic_ns()}.json"
    if not fault_tolerant:
        env.update(_plain_allocator())
        plain = ["--num_processes", "4", "--use_fsdp", "--fsdp_version", "2", "--parallelism_config_dp_replicate_size",
                 "2", "--parallelism_config_dp_shard_size", "2"] if fsdp else ["--num_processes", "2"]
        proc = _launch(plain, out, env, folder / "ddp.log")
        assert proc.wait(600) == 0, (folder / "ddp.log").read_text()[-2000:]
        return json.loads(out.read_text())
    lighthouse, address = _lighthouse(2, env)
    try:
        procs = [_launch(_ft_flags(address, g, fsdp), out.with_suffix(f".{g}"), env, folder / f"ft{g}.log")
                 for g in (0, 1)]
        for g, proc in enumerate(procs):
            assert proc.wait(600) == 0, (folder / f"ft{g}.log").read_text()[-2000:]
    finally:
        lighthouse.terminate()
        lighthouse.wait(30)
    return json.loads(out.with_suffix(".0").read_text())


def heal(hidden: int, folder: Path, fsdp: bool = False) -> dict[str, float]:
    """Group 1 launched while group 0 trains: its heal's time (s) and size (MB), read from its report (with
    ``fsdp``, groups of 2 processes sharding the model with FSDP2: the size is process 0's shard)."""
    env = {**_env(), "BENCH_STEP_SLEEP": "0.05"}
    lighthouse, address = _lighthouse(1, env)
    WORKER_ARGS[:] = ["--hidden", str(hidden), "--steps", "600"]
    try:
        first = _launch(_ft_flags(address, 0, fsdp), folder / "heal0.json", env, folder / "heal0.log")
        deadline = time.monotonic() + 300
        while "first quorum" not in (folder / "heal0.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        second = _launch(_ft_flags(address, 1, fsdp), folder / "heal1.json", env, folder / "heal1.log")
        while "healed from" not in (folder / "heal1.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        for proc in (first, second):
            proc.kill()
            proc.wait(60)
    finally:
        lighthouse.terminate()
        lighthouse.wait(30)
    text = (folder / "heal1.log").read_text()
    found = re.search(r"in ([0-9.]+) s: ([0-9.]+) (B|kB|MB|GB)", text)
    assert found, text[-2000:]
    scale = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}[found.group(3)]
    return {"seconds": float(found.group(1)), "megabytes": float(found.group(2)) * scale}


WORKER_ARGS: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heal-sizes", type=int, nargs="*", default=[256, 1024, 2048])
    parser.add_argument("--fsdp", action="store_true", help="groups of 2 processes that shard with FSDP2 (against "
                        "plain HSDP over 4 processes: 2 replicas of 2 shards)")
    parser.add_argument("--parts", action="store_true", help="also time the step's parts and torchft's calls")
    parser.add_argument("--bucket-view", action="store_true", help="plain DDP with gradient_as_bucket_view=True "
                        "too (the fault-tolerant mode turns it on)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("out", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.hidden, args.steps, args.out, args.parts, args.bucket_view)
        return
    results: dict[str, list[float]] = {"ddp": [], "ft": []}
    parts: dict[str, list[dict[str, float]]] = {"ddp": [], "ft": []}
    heals = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(args.rounds):
            for mode in ("ddp", "ft"):
                WORKER_ARGS[:] = ["--hidden", str(args.hidden), "--steps", str(args.steps),
                                  *(["--parts"] if args.parts else []),
                                  *(["--bucket-view"] if args.bucket_view else [])]
                result = step_time(mode == "ft", folder, args.fsdp)
                results[mode].append(result["median_s"])
                parts[mode] += [result["parts_ms"]] if args.parts else []
        for hidden in args.heal_sizes:
            heals[hidden] = heal(hidden, folder, args.fsdp)
    ratios = _print_step_times(results, args.rounds, args.fsdp) if args.rounds else []
    if args.parts and args.rounds:
        _print_parts(parts)
    print(f"| hidden | heal (s) | sent (MB{', process 0' if args.fsdp else ''}) |\n|---|---|---|")
    for hidden, found in heals.items():
        print(f"| {hidden} | {found['seconds']:.2f} | {found['megabytes']:.2f} |")
    ratio = statistics.median(results["ft"]) / statistics.median(results["ddp"]) if args.rounds else None
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "load": os.getloadavg()[0], "hidden": args.hidden, "steps": args.steps, "step_s": results, "parts_ms": parts if args.parts else None,
              "ratio": ratio, "round_ratios": ratios,
              "plain_gradient_as_bucket_view": args.bucket_view, "heal": heals, "heal_inside_groups": "FSDP2, 2 processes" if args.fsdp else "1 process"}
    (HERE / "results").mkdir(exist_ok=True)
    name = "ft_overhead_fsdp2.json" if args.fsdp else "ft_overhead.json"
    name = name.replace(".json", "_bucket_view.json") if args.bucket_view else name
    (HERE / "results" / name).write_text(json.dumps(record, indent=2) + "\n")


def _print_step_times(results: dict[str, list[float]], rounds: int, fsdp: bool) -> list[float]:
    """The step-time table; returns each round's own ratio, in order."""
    ddp, ft = statistics.median(results["ddp"]), statistics.median(results["ft"])
    print(f"| mode | median step (ms), {rounds} rounds | per round (ms) |\n|---|---|---|")
    names = (("plain HSDP, 2 replicas x 2 shards", "2 replica groups of 2, FSDP2 inside (--ft_lighthouse)") if fsdp
             else ("plain DDP, 2 processes", "2 replica groups (--ft_lighthouse)"))
    for mode, key in zip(names, ("ddp", "ft")):
        per_round = ", ".join(f"{1e3 * t:.2f}" for t in results[key])
        print(f"| {mode} | {1e3 * statistics.median(results[key]):.2f} | {per_round} |")
    # each round ran both modes back to back: its own ratio is less exposed to the load of the moment
    ratios = sorted(f / d for d, f in zip(results["ddp"], results["ft"]))
    print(f"\nfault-tolerant / plain {'HSDP' if fsdp else 'DDP'}: x{ft / ddp:.3f} (medians); per round x{statistics.median(ratios):.3f} "
          f"(median; from x{ratios[0]:.3f} to x{ratios[-1]:.3f}) (target <= x{TARGET})\n")
    return ratios


def _print_parts(parts: dict[str, list[dict[str, float]]]) -> None:
    """The medians over the rounds of each part of the step, plain against fault-tolerant."""
    names = list(dict.fromkeys(name for mode in ("ddp", "ft") for run in parts[mode] for name in run))
    print("| part of the step (ms, median over rounds) | plain | fault-tolerant |\n|---|---|---|")
    for name in names:
        cells = [f"{statistics.median(run[name] for run in parts[mode]):.2f}" if name in parts[mode][0] else "-"
                 for mode in ("ddp", "ft")]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print()


if __name__ == "__main__":
    main()
