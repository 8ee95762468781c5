"""How long ``overdrive launch`` takes to refuse a bad flag or value (target: under 0.5 s, before torch loads).

    .venv/bin/python bench/arg_check_time.py             # 5 rounds of each case, ~30 s on 2 CPU cores
    .venv/bin/python bench/arg_check_time.py --rounds 10

Each case is one mistake a user makes, run as ``python -m overdrive.cli launch ...`` in a fresh process (what
the ``overdrive`` command does) from a folder holding ``train.py``; a sample is the command's wall time from
start to exit. Also reported: whether the process imported torch (it must not, for a refusal), and the time of
``python -c pass`` (the interpreter's own start, which no command can beat). Writes a markdown table to
stdout and JSON to bench/results/arg_check_time.json.
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
TARGET_S = 0.5
CASES = {
    "--num_processes 0": ["--num_processes", "0"],
    "--mixed_precision fp32": ["--mixed_precision", "fp32"],
    "unknown flag --num_proceses": ["--num_proceses", "2"],
    "--rdzv_backend c10": ["--rdzv_backend", "c10"],
    "--use_deepspeed --zero_stage 5": ["--use_deepspeed", "--zero_stage", "5"],
    "--dynamo_backend indutor": ["--dynamo_backend", "indutor"],
    "--num_machines 2 without an address": ["--num_machines", "2", "--num_processes", "2"],
}
# prints whether torch was imported after the command returned (the command itself is overdrive.cli.main)
PROBE = ("import sys; from overdrive.cli import main; code = main(sys.argv[1:]); "
         "print('TORCH', 'torch' in sys.modules); sys.exit(code)")


def sample(args: list[str], cwd: str) -> tuple[float, int, bool]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    elapsed = time.perf_counter() - started
    return elapsed, result.returncode, "TORCH True" in result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    load_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "train.py").write_text("print('trained')\n")
        sample(["--version"], folder)  # warm-up (the file cache)
        interpreter = []
        for _ in range(rounds):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            interpreter.append(time.perf_counter() - started)
        for name, flags in CASES.items():
            samples = [sample(["launch", *flags, "train.py"], folder) for _ in range(rounds)]
            times = [s[0] for s in samples]
            rows.append({"case": name, "median_s": statistics.median(times), "max_s": max(times),
                         "exit_codes": sorted({s[1] for s in samples}), "torch_imported": any(s[2] for s in samples)})
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rounds": rounds,
              "python": platform.python_version(), "cpus": os.cpu_count(), "load_start": load_start,
              "load_end": os.getloadavg()[0], "python_alone_median_s": statistics.median(interpreter),
              "target_s": TARGET_S, "cases": rows}
    print(f"| case | median s | max s | exit | torch imported | target {TARGET_S} s |\n|---|---|---|---|---|---|")
    for row in rows:
        verdict = "met" if row["median_s"] < TARGET_S and not row["torch_imported"] else "missed"
        print(f"| {row['case']} | {row['median_s']:.3f} | {row['max_s']:.3f} | {row['exit_codes']} | "
              f"{row['torch_imported']} | {verdict} |")
    print(f"\npython -c pass: {result['python_alone_median_s']:.3f} s; load {load_start:.1f} -> "
          f"{result['load_end']:.1f}")
    out = HERE / "results" / "arg_check_time.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
