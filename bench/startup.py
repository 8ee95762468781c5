"""Time from the command's start to the first finished training step: plain PyTorch against overdrive.

    .venv/bin/python bench/startup.py                  # both settings, 10 rounds each: ~5 min on 2 CPU cores
    .venv/bin/python bench/startup.py --procs 1 --rounds 20

- 1 process: ``python bench/startup_plain.py`` against ``python bench/startup_overdrive.py`` (import torch,
  model, optimizer, DataLoader, one step; overdrive adds ``import overdrive``, ``Accelerator()`` and
  ``prepare()``). Target (issue 15): at most +50 ms.
- 2 processes: ``torchrun --nproc-per-node 2 bench/startup_plain.py`` (DDP, DistributedSampler) against
  ``overdrive launch --num_processes 2 bench/startup_overdrive.py``. Target: at most x1.02.

Four measures per sample: wall time (the latest rank's clock stamp after its first step minus the time just
before the command started: what the issue asks, but on a shared machine it carries seconds of other work);
the CPU time the ranks used up to their first step (``time.process_time()`` in the scripts); the CPU time
of the whole process tree (launcher included) to its exit (``RUSAGE_CHILDREN``); and the ranks' CPU time from
the end of ``import torch`` (the same code in both scripts up to there) to their first step, which leaves out
the interpreter's start and torch's import: the same work in both commands, and most of the noise on a busy
machine. The two commands of a setting alternate (ABBA) after a discarded warm-up pair; reported are the
medians, the median of the paired differences and ratios, and distribution-free 95% confidence intervals of
those medians (order statistics). Writes bench/results/startup.json.

Bytecode: Python caches compiled modules (``__pycache__``; pip compiles a wheel's modules when it installs
it), and torch's are cached here. Environments that set ``PYTHONDONTWRITEBYTECODE=1`` (this machine's does)
would make overdrive, an editable install, compile its ~430 kB of source on every run while torch loads
cached bytecode. So the commands run with the bytecode cache on and ``PYTHONPYCACHEPREFIX`` in a temporary
folder of this run (the source tree stays clean; both commands load cached bytecode after the warm-up pair).
``--no-bytecode-cache`` measures the other condition (``PYTHONDONTWRITEBYTECODE=1``, no cache folder: torch
loads its installed bytecode, overdrive and the script compile from source; results in
bench/results/startup-no-bytecode-cache.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PLAIN, MINE = str(HERE / "startup_plain.py"), str(HERE / "startup_overdrive.py")
SETTINGS = {
    1: {"plain": [sys.executable, PLAIN], "overdrive": [sys.executable, MINE]},
    2: {"plain": [str(BIN / "torchrun"), "--nproc-per-node", "2", PLAIN],
        "overdrive": [str(BIN / "overdrive"), "launch", "--num_processes", "2", MINE]},
}
TARGET_EXTRA_MS, TARGET_RATIO = 50.0, 1.02


def sample(command: list[str], env: dict[str, str], ranks: int) -> tuple[float, float, float, float]:
    """(wall s to the latest rank's first step, CPU s of the ranks up to their first step, CPU s of the whole
    command tree to its exit, CPU s of the ranks from ``import torch`` done to their first step)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stamps = [line.split()[2:5] for line in result.stdout.splitlines() if line.startswith("FIRST_STEP ")]
    if result.returncode != 0 or len(stamps) != ranks:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    tree = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    after_torch = sum(float(s[1]) - float(s[2]) for s in stamps)
    return max(float(s[0]) for s in stamps) - started, sum(float(s[1]) for s in stamps), tree, after_torch


def bench_env(no_bytecode_cache: bool) -> tuple[dict[str, str], tempfile.TemporaryDirectory]:
    """The commands' environment (no inherited launch variables, no config file, one thread) and the temporary
    bytecode cache folder it names (see the module's docstring; clean it up when done)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_",
                                                                       "LOCAL_RANK", "OVERDRIVE_"))}
    env["OVERDRIVE_CONFIG_FILE"] = os.path.join(tempfile.gettempdir(), "overdrive-bench-no-config.yaml")
    env["OMP_NUM_THREADS"] = "1"  # what both launchers pick for 2 processes on 2 cores; the same for 1 process
    cache = tempfile.TemporaryDirectory(prefix="overdrive-bench-pycache-")
    if no_bytecode_cache:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache.name
    return env, cache


def median_ci(values: list[float]) -> tuple[float, float]:
    ordered, n = sorted(values), len(values)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def run_setting(procs: int, rounds: int, env: dict[str, str]) -> dict:
    commands = SETTINGS[procs]
    metrics = ("wall", "ranks_cpu", "tree_cpu", "ranks_cpu_after_torch")
    times: dict[str, dict[str, list[float]]] = {m: {"plain": [], "overdrive": []} for m in metrics}
    for index in range(rounds + 1):
        for name in (("plain", "overdrive") if index % 2 == 0 else ("overdrive", "plain")):
            values = sample(commands[name], env, procs)
            if index > 0:  # the first pair warms the page cache
                for metric, value in zip(metrics, values):
                    times[metric][name].append(value)
        if index > 0:
            print(f"{procs} proc(s), round {index}/{rounds}: " + ", ".join(
                f"{m} {times[m]['plain'][-1]:.2f}/{times[m]['overdrive'][-1]:.2f} s" for m in metrics), file=sys.stderr)
    result: dict = {"commands": {k: " ".join(v) for k, v in commands.items()}, "seconds": times}
    for metric in metrics:
        pair = times[metric]
        diffs = [(a - b) * 1e3 for a, b in zip(pair["overdrive"], pair["plain"])]
        ratios = [a / b for a, b in zip(pair["overdrive"], pair["plain"])]
        result[metric] = {"median_s": {k: statistics.median(v) for k, v in pair.items()},
                          "extra_ms": statistics.median(diffs), "extra_ms_ci": median_ci(diffs),
                          "ratio": statistics.median(ratios), "ratio_ci": median_ci(ratios)}
    return result


def verdict(low: float, high: float, target: float) -> str:
    return "met" if high <= target else "MISSED" if low > target else "not resolved (CI spans it)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="PYTHONDONTWRITEBYTECODE=1: overdrive and the scripts compile from source each run")
    args = parser.parse_args()
    env, cache = bench_env(args.no_bytecode_cache)
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results = {procs: run_setting(procs, args.rounds, env) for procs in args.procs}
    labels = {"wall": "wall s to first step", "ranks_cpu": "CPU s of the ranks to first step",
              "tree_cpu": "CPU s of all processes, to exit",
              "ranks_cpu_after_torch": "CPU s of the ranks from `import torch` done to first step"}
    for procs, r in results.items():
        short = {k: v.replace(str(BIN) + "/", "").replace(str(HERE.parent) + "/", "") for k, v in r["commands"].items()}
        print(f"\n{procs} process(es): plain `{short['plain']}`, overdrive `{short['overdrive']}`, bytecode cache "
              f"{'off' if args.no_bytecode_cache else 'on'}\n")
        print("| measure | plain (median) | overdrive (median) | overdrive - plain, ms [95% CI] | "
              "overdrive / plain [95% CI] | target |\n|---|---|---|---|---|---|")
        for metric, label in labels.items():
            m = r[metric]
            (dlow, dhigh), (rlow, rhigh) = m["extra_ms_ci"], m["ratio_ci"]
            target = (f"<= +{TARGET_EXTRA_MS:.0f} ms: {verdict(dlow, dhigh, TARGET_EXTRA_MS)}" if procs == 1 else
                      f"<= x{TARGET_RATIO}: {verdict(rlow, rhigh, TARGET_RATIO)}")
            print(f"| {label} | {m['median_s']['plain']:.3f} | {m['median_s']['overdrive']:.3f} | "
                  f"{m['extra_ms']:+.0f} [{dlow:+.0f} to {dhigh:+.0f}] | {m['ratio']:.3f} [{rlow:.3f}-{rhigh:.3f}] | "
                  f"{target} |")
    out = HERE / "results" / ("startup-no-bytecode-cache.json" if args.no_bytecode_cache else "startup.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "commit": commit, "rounds": args.rounds,
                               "cpu_count": os.cpu_count(), "bytecode_cache": not args.no_bytecode_cache,
                               "load_avg_start_end": [load0, os.getloadavg()],
                               "results": results}, indent=1))
    cache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
