"""What importing overdrive costs on top of ``import torch``, against Accelerate and Lightning Fabric.

    .venv/bin/python bench/import_time.py            # 10 rounds, ~2 min on 2 CPU cores
    .venv/bin/python bench/import_time.py --quick    # 3 rounds, ~40 s
    .venv/bin/python bench/import_time.py --rounds 20

Each sample is a fresh interpreter that times, with perf_counter, ``import torch`` and then the
statement under test; the "extra" is the second span, i.e. the cost over an already imported torch
(the difference of two ~1.3 s totals would drown in noise). Statements run round-robin after one
discarded warm-up round; the median over rounds is reported. Each subprocess also lists which heavy
optional modules (torch._dynamo, sympy, tensorboard, deepspeed, transformers) ended up in sys.modules.
Finally ``-X importtime`` (min of 3 runs) lists the modules that cost most inside ``from overdrive import
Accelerator``. Writes a markdown table to stdout and JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

WATCHED = ("torch._dynamo", "sympy", "tensorboard", "deepspeed", "transformers")
# label -> (statement after `import torch`, module that must be importable for the row to run)
STATEMENTS = {
    "import torch": ("pass", None),
    "import overdrive": ("import overdrive", "overdrive"),
    "from overdrive import Accelerator": ("from overdrive import Accelerator", "overdrive"),
    "import accelerate": ("import accelerate", "accelerate"),
    "from accelerate import Accelerator": ("from accelerate import Accelerator", "accelerate"),
    "from lightning.fabric import Fabric": ("from lightning.fabric import Fabric", "lightning"),
}
MUST_STAY_OUT = ("import overdrive", "from overdrive import Accelerator")
TARGET_MS = 100.0  # `import overdrive` over `import torch`, from the issue

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
{statement}
t2 = time.perf_counter()
print(json.dumps({{"torch_ms": (t1 - t0) * 1e3, "extra_ms": (t2 - t1) * 1e3,
                  "watched": [m for m in {watched!r} if m in sys.modules]}}))
"""


def installed(module: str | None) -> bool:
    if module is None:
        return True
    probe = subprocess.run([sys.executable, "-c", f"import importlib.util as u; "
                            f"raise SystemExit(u.find_spec({module!r}) is None)"], capture_output=True)
    return probe.returncode == 0


def sample(statement: str) -> dict:
    code = PROBE.format(statement=statement, watched=WATCHED)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def heaviest_imports(statement: str, top: int, runs: int = 3) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of the costliest modules imported after torch by ``statement``:
    the minimum of ``runs`` runs per module (the first run after a source edit also compiles .pyc files)."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import torch\n{statement}"],
                              capture_output=True, text=True, timeout=120)
        after_torch = False
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
                continue
            self_us, cumulative_us, name = line[len("import time:"):].split("|", 2)
            if after_torch:
                old = best.get(name.strip(), (float("inf"), float("inf")))
                best[name.strip()] = (min(old[0], int(self_us) / 1e3), min(old[1], int(cumulative_us) / 1e3))
            elif name.rstrip() == " torch":  # torch's own top-level line: the statement's imports follow
                after_torch = True
    return sorted(((name, s, c) for name, (s, c) in best.items()), key=lambda e: -e[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="fresh interpreters per statement")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--out", help="JSON path (default bench/results/import_time[_quick].json)")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    labels = [label for label, (_, module) in STATEMENTS.items() if installed(module)]
    skipped = [label for label in STATEMENTS if label not in labels]
    started = datetime.now(timezone.utc)
    samples: dict[str, list[dict]] = {label: [] for label in labels}
    for r in range(rounds + 1):  # round 0 warms the file cache and is discarded
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            result = sample(STATEMENTS[label][0])
            if r > 0:
                samples[label].append(result)
        print(f"[round {r}/{rounds}]", file=sys.stderr)

    rows, problems = [], []
    for label in labels:
        good = [s for s in samples[label] if "error" not in s]
        if not good:
            rows.append({"statement": label, "error": samples[label][0]["error"]})
            continue
        watched = sorted({m for s in good for m in s["watched"]})
        row = {"statement": label, "torch_ms": statistics.median(s["torch_ms"] for s in good),
               "extra_ms": statistics.median(s["extra_ms"] for s in good),
               "extra_ms_min": min(s["extra_ms"] for s in good), "extra_ms_max": max(s["extra_ms"] for s in good),
               "samples": len(good), "heavy_modules_loaded": watched}
        rows.append(row)
        if label in MUST_STAY_OUT and watched:
            problems.append(f"`{label}` imported {', '.join(watched)}")

    lines = ["| `import torch; ...` | extra ms over torch (median) | min-max | `import torch` ms (median) | "
             "heavy modules loaded |", "|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| `{row['statement']}` | failed: {row['error'][:100]} | | | |")
            continue
        note = ""
        if row["statement"] == "import overdrive":
            note = f" (target < {TARGET_MS:.0f}: {'met' if row['extra_ms'] < TARGET_MS else 'MISSED'})"
        lines.append(f"| `{row['statement']}` | {row['extra_ms']:.1f}{note} | {row['extra_ms_min']:.1f}-"
                     f"{row['extra_ms_max']:.1f} | {row['torch_ms']:.0f} | "
                     f"{', '.join(row['heavy_modules_loaded']) or 'none'} |")
    md = "\n".join(lines)
    print(md)
    heavy = []
    if "from overdrive import Accelerator" in labels:
        heavy = heaviest_imports("from overdrive import Accelerator", top=10)
        print("\nCostliest modules inside `from overdrive import Accelerator` (-X importtime, min of 3 runs):")
        for name, self_ms, cumulative_ms in heavy:
            print(f"  {self_ms:7.1f} ms self {cumulative_ms:8.1f} ms cumulative  {name}")
    for label in skipped:
        print(f"skipped `{label}`: not installed")
    print("\n" + ("\n".join(f"PROBLEM: {p}" for p in problems) if problems else
                  f"ok: {' / '.join(MUST_STAY_OUT)} loaded none of {', '.join(WATCHED)}"))

    meta = {"date": started.isoformat(timespec="seconds"), "cpu_count": os.cpu_count(), "rounds": rounds,
            "python": platform.python_version(), "machine": platform.machine(), "load_avg": os.getloadavg()}
    out = Path(args.out or Path(__file__).parent / "results" / f"import_time{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows, "samples": samples, "skipped": skipped,
                               "heaviest_overdrive_imports": heavy, "problems": problems, "markdown": md},
                              indent=1))
    print(f"\nwritten to {out}", file=sys.stderr)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
