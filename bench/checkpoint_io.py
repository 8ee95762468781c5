"""Save and load time and peak memory of ``save_state`` / ``load_state`` against ``torch.save`` / ``torch.load``.

    .venv/bin/python bench/checkpoint_io.py               # ~100M parameters + AdamW state, 8 rounds
    .venv/bin/python bench/checkpoint_io.py --hidden 2048 --rounds 2   # smaller and quicker

One process builds a model of ``--layers`` Linear(hidden, hidden) layers (6 x 4096^2 ~ 100.7M parameters),
takes one AdamW step so that the optimizer state exists (2 more tensors per parameter: ~1.2 GB of state
in all), and then runs, round after round and in rotating order, the four operations:

- ``save_state``: overdrive's checkpoint in its default layout (Accelerate's files + overdrive's JSON, fsync'ed, CRC-32 of
  every file, atomic rename; the resharding layout's DCP files when the code predates that default);
- ``save_state(async_save=True), blocked``: the time the call blocks (the state is staged into host memory;
  the write, checksums and publication go on in the background and are waited for, untimed, after);
- ``torch.save``: ``{"model": ..., "optimizer": ...}`` to one file, then fsync (a checkpoint is only a
  checkpoint once it is on the disk);
- ``load_state``: into the live model and optimizer (files verified against the manifest's checksums);
- ``torch.load``: ``weights_only=True``, then ``load_state_dict`` on the model and the optimizer.

Time is wall clock; memory is the peak resident set size above the level before the operation, sampled
every 2 ms from /proc/self/statm. glibc keeps freed memory unless ``MALLOC_MMAP_THRESHOLD_`` is set, so
the script re-executes itself with ``MALLOC_MMAP_THRESHOLD_=131072`` (see /work/shared/PLATFORM.md).
Every save writes new files (as a new checkpoint would) and ``os.sync()`` runs, untimed, before each
operation. Loads read files that were just written (warm page cache), for both contenders alike. Also measured: the
checksum cost (CRC-32, the manifest's, and BLAKE2b for comparison) over the checkpoint's files, and
``load_state(verify=False)``. Prints a markdown table and writes bench/results/checkpoint_io.json.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_"


class PeakRSS:
    """The highest RSS seen while the block runs, above the RSS when it started (bytes)."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE")

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self.peak = max(self.peak, self._rss())
        self._stop.set()
        self._thread.join()

    @property
    def extra(self) -> int:
        return self.peak - self.base


def build(hidden: int, layers: int) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    from overdrive import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, hidden)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return accelerator, model, optimizer


def files_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def digest_seconds(path: Path, kind: str) -> float:
    from overdrive.checkpoint.storage import checksum

    files = [p for p in path.rglob("*") if p.is_file()]
    start = time.perf_counter()
    for file in files:
        if kind == "crc32":
            checksum(file)
        else:
            h = hashlib.blake2b(digest_size=16)
            with open(file, "rb") as f:
                while chunk := f.read(16 << 20):
                    h.update(chunk)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    accelerator, model, optimizer = build(args.hidden, args.layers)
    params = sum(p.numel() for p in model.parameters())
    work = Path(tempfile.mkdtemp(prefix="overdrive-ckpt-bench-", dir=args.dir))
    ckpt, plain = work / "ckpt", work / "plain.pt"

    def save_state() -> None:
        accelerator.save_state(ckpt)

    def torch_save() -> None:
        # a new file, as a new checkpoint would be (rewriting the blocks of an existing file is faster here)
        fresh = plain.with_name(f"plain-{time.monotonic_ns()}.pt")
        with open(fresh, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, plain)

    def save_state_async() -> None:
        # timed: only what the training loop waits for (staging the copy); the write is waited for after
        accelerator.save_state(work / "async", async_save=True)

    def load_state() -> None:
        accelerator.load_state(ckpt)

    def load_state_unverified() -> None:
        accelerator.load_state(ckpt, verify=False)

    def torch_load() -> None:
        state = torch.load(plain, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    ops = {"save_state": save_state, "torch.save": torch_save, "save_state(async_save=True), blocked": save_state_async,
           "load_state": load_state,
           "load_state(verify=False)": load_state_unverified, "torch.load": torch_load}
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in ops}
    cpu: dict[str, list[float]] = {name: [] for name in ops}  # CPU seconds of the process (all its threads)
    try:
        save_state()  # warm-up: imports, first-call costs
        torch_save()
        names = list(ops)
        for round_index in range(args.rounds):
            # saves first (loads need the files), each group in rotating order
            saves = names[:3]
            order = saves[round_index % 3:] + saves[:round_index % 3]
            loads = names[3:]
            order += loads[round_index % 3:] + loads[:round_index % 3]
            for name in order:
                gc.collect()
                os.sync()  # the previous operation's writeback must not be billed to this one
                with PeakRSS() as memory:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    ops[name]()
                    elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
                if name.startswith("save_state(async"):  # the background write, untimed, before the next op
                    from overdrive.checkpoint.background import wait_for_pending_save

                    wait_for_pending_save()
                samples[name].append((elapsed, memory.extra))
                cpu[name].append(used)
                print(f"round {round_index + 1}: {name:<26} {elapsed:7.2f} s  +{memory.extra / 2**20:8.0f} MiB",
                      file=sys.stderr, flush=True)
        digests = {kind: statistics.median(digest_seconds(ckpt, kind) for _ in range(args.rounds))
                   for kind in ("crc32", "blake2b")}
        sizes = {"save_state": files_bytes(ckpt), "torch.save": files_bytes(plain)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = {}
    for name, (mine, reference, target) in RATIOS.items():
        wall = [a / b for (a, _), (b, _) in zip(samples[mine], samples[reference])]
        cpu_ratio = [a / b for a, b in zip(cpu[mine], cpu[reference]) if b > 0]
        low, high = median_ci(wall)
        verdict = "met" if high <= target else "missed" if low > target else "not resolved"
        ratios[name] = {"reference": reference, "target": target, "wall_median": statistics.median(wall),
                        "wall_ci95": [low, high], "wall_per_round": wall, "verdict": verdict,
                        "cpu_median": statistics.median(cpu_ratio) if cpu_ratio else None}
    return {"params": params, "state_bytes": sizes, "digests_s": digests, "ratios": ratios,
            "cpu_seconds": {name: statistics.median(v) for name, v in cpu.items()},
            "median": {name: {"seconds": statistics.median(s for s, _ in v),
                              "peak_extra_mib": statistics.median(m for _, m in v) / 2**20}
                       for name, v in samples.items()},
            "samples": samples}


#: The ratios issue 15 sets targets for: (operation, its reference, target), per round, same run.
RATIOS = {"save_state / torch.save": ("save_state", "torch.save", 1.0),
          "async blocked / torch.save": ("save_state(async_save=True), blocked", "torch.save", 0.1),
          "load_state / torch.load": ("load_state", "torch.load", 1.0)}


def median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free ~95% confidence interval of the median (order statistics)."""
    ordered, n = sorted(values), len(values)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return ordered[k], ordered[n - 1 - k]


def table(result: dict[str, Any], args: argparse.Namespace) -> str:
    gb = result["state_bytes"]["save_state"] / 1e9
    lines = [f"{result['params'] / 1e6:.1f}M parameters + AdamW state; checkpoint {gb:.2f} GB "
             f"(torch.save file {result['state_bytes']['torch.save'] / 1e9:.2f} GB); {args.rounds} rounds",
             "", "| operation | median time (s) | fastest - slowest (s) | CPU s, median | GB/s at the median | "
             "peak RSS above start, median (MiB) |", "|---|---|---|---|---|---|"]
    for name, row in result["median"].items():
        times = [t for t, _ in result["samples"][name]]
        lines.append(f"| {name} | {row['seconds']:.2f} | {min(times):.2f} - {max(times):.2f} | "
                     f"{result['cpu_seconds'][name]:.2f} | {gb / row['seconds']:.2f} | {row['peak_extra_mib']:.0f} |")
    for kind, seconds in result["digests_s"].items():
        lines.append(f"| {kind} of every file (alone, warm cache) | {seconds:.2f} | | | {gb / seconds:.2f} | - |")
    lines += ["", "| ratio (per round, same run) | median [95% CI] | per round | CPU-time ratio, median | target | "
              "verdict |", "|---|---|---|---|---|---|"]
    for name, row in result["ratios"].items():
        low, high = row["wall_ci95"]
        cpu_ratio = "-" if row["cpu_median"] is None else f"x{row['cpu_median']:.3f}"
        lines.append(f"| {name} | x{row['wall_median']:.3f} [{low:.3f}-{high:.3f}] | "
                     f"{min(row['wall_per_round']):.2f}-{max(row['wall_per_round']):.2f} | {cpu_ratio} | "
                     f"<= x{row['target']} | {row['verdict']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=8, help="even: each save goes first equally often")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the temporary files go (default: the system temp dir)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "checkpoint_io.json"))
    args = parser.parse_args()
    if os.environ.get(MALLOC_ENV) is None:  # must be set before the process starts to take effect
        os.environ[MALLOC_ENV] = "131072"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result = run(args)
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    result["started"] = started
    result["setup"] = {"argv": sys.argv, "python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(), MALLOC_ENV: os.environ[MALLOC_ENV]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(result, args))
    print(f"\nstarted {started}; load average (1, 5, 15 min) at start {load_start}, at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
