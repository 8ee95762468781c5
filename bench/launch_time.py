"""Time from a launch command's start to the first training step: ``overdrive launch`` against ``torchrun``.

    .venv/bin/python bench/launch_time.py              # 10 rounds of each, ~4 min on 2 CPU cores
    .venv/bin/python bench/launch_time.py --rounds 4   # quicker, noisier

Both commands start 2 processes of bench/first_step.py, which builds an ``overdrive.Accelerator``, takes
one DDP step and prints the wall-clock time. A sample is the latest rank's stamp minus the time just
before the command was started (both from ``time.time()`` on this machine). The commands run
interleaved (ABBA order) after one discarded warm-up pair; medians are reported. Writes a markdown
table to stdout and JSON to bench/results/launch_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "first_step.py")
BIN = Path(sys.executable).parent
COMMANDS = {
    "overdrive launch --num_processes 2": [str(BIN / "overdrive"), "launch", "--num_processes", "2", SCRIPT],
    "torchrun --nproc-per-node 2": [str(BIN / "torchrun"), "--nproc-per-node", "2", SCRIPT],
}
TARGET_RATIO = 1.10  # within 10% of torchrun, from the issue


def sample(command: list[str], env: dict[str, str]) -> float:
    started = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    stamps = [float(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("FIRST_STEP ")]
    if result.returncode != 0 or len(stamps) != 2:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return max(stamps) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    env["OVERDRIVE_CONFIG_FILE"] = os.path.join(tempfile.gettempdir(), "overdrive-bench-no-config.yaml")
    env["OMP_NUM_THREADS"] = "1"  # what both launchers pick for 2 processes on 2 cores; torchrun warns without it
    env["ACCELERATE_USE_CPU"] = "true"  # torchrun's processes join as overdrive launch's do (as under Accelerate)
    names = list(COMMANDS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.rounds + 1):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            seconds = sample(COMMANDS[name], env)
            if round_index > 0:  # the first pair warms the page cache
                times[name].append(seconds)
        print(f"round {round_index}/{args.rounds}: " +
              ", ".join(f"{n.split()[0]} {times[n][-1]:.2f}s" for n in names if times[n]), file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians[names[0]] / medians[names[1]]
    print("| command | median s to first step | min | max |\n|---|---|---|---|")
    for name in names:
        print(f"| `{name}` | {medians[name]:.2f} | {min(times[name]):.2f} | {max(times[name]):.2f} |")
    verdict = "within" if ratio <= TARGET_RATIO else "NOT within"
    print(f"\nratio overdrive / torchrun: {ratio:.3f} ({verdict} the {TARGET_RATIO - 1:.0%} target), "
          f"{args.rounds} rounds, {os.cpu_count()} CPU cores")
    out = HERE / "results" / "launch_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rounds": args.rounds,
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "seconds": times,
        "median": medians, "ratio": ratio, "target_ratio": TARGET_RATIO,
        "commands": {name: " ".join(cmd) for name, cmd in COMMANDS.items()},
    }, indent=2))
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
