"""Where a cold compile of ``bench/compile_time.py``'s transformer spends its time, whole-model vs regional: one
fresh process per variant, an empty ``TORCHINDUCTOR_CACHE_DIR``, one training step, kernel builds run one at a
time in the process (``compile_threads=1``) so their CPU time is the CPU time of its child processes.

    .venv/bin/python bench/compile_profile.py --blocks 12            # whole and regional, ~3-5 min on 2 cores
    .venv/bin/python bench/compile_profile.py --blocks 12 --modes whole regional by-hand eager --steady 16
    .venv/bin/python bench/compile_profile.py --blocks 12 --modes regional --caches   # what each cache saves

Per variant: graphs compiled and recompiles (dynamo's counters), seconds per compile phase (torch's
``dynamo_timed`` metrics: dynamo tracing, AOTAutograd, inductor lowering and code generation), the number of
C++ compiler runs and distinct kernels built, and CPU time split into this process (Python: tracing,
AOTAutograd, lowering, code generation) and its children (the C++ compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: torch's ``dynamo_timed`` keys reported, in the order of the compile pipeline
PHASES = ("_compile.compile_inner", "OutputGraph.call_user_compiler", "create_aot_dispatcher_function",
          "compile_fx_inner", "GraphLowering.run", "GraphLowering.codegen", "Scheduler.__init__",
          "Scheduler.codegen", "PyCodeCache.load_by_key_path", "async_compile.wait", "compile_file")


def child(mode: str, blocks: int, options: dict, artifacts: str = "") -> None:
    """One cold (or, with ``artifacts``, mega-cache) step; ``artifacts``: a file of torch's mega-cache, loaded
    before the compile when it exists, else written after it."""
    import torch

    torch.set_num_threads(1)
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch._inductor import cpp_builder

    builds: list[tuple[str, float]] = []  # (kind, CPU seconds) of each C++ compiler run
    original = cpp_builder.CppBuilder.build

    def timed_build(self) -> None:
        start = _children_cpu()
        original(self)
        builds.append((_kind(self), _children_cpu() - start))

    cpp_builder.CppBuilder.build = timed_build
    sys.path.insert(0, str(HERE))
    from compile_time import prepared  # the benchmark's model and step

    cpu0, children0 = time.process_time(), _children_cpu()
    if artifacts and Path(artifacts).exists():
        torch.compiler.load_cache_artifacts(Path(artifacts).read_bytes())
    step = prepared(mode, blocks, options)
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    if artifacts and not Path(artifacts).exists():
        saved = torch.compiler.save_cache_artifacts()
        Path(artifacts).write_bytes(saved[0] if saved else b"")
    print(json.dumps({
        "mode": mode, "options": options, "first_step_s": round(first, 2),
        "python_cpu_s": round(time.process_time() - cpu0, 2), "cxx_cpu_s": round(_children_cpu() - children0, 2),
        "graphs": counters["stats"]["unique_graphs"], "frames_ok": counters["frames"]["ok"],
        "recompiles": sum(counters["recompiles"].values()), "graph_breaks": sum(counters["graph_break"].values()),
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
        "phases_s": {k: [round(sum(compilation_time_metrics[k]), 2), len(compilation_time_metrics[k])]
                     for k in PHASES if k in compilation_time_metrics},
        "cxx_runs_cpu_s": {kind: [sum(1 for k, _ in builds if k == kind),
                                  round(sum(t for k, t in builds if k == kind), 2)]
                           for kind in sorted({k for k, _ in builds})},
        "kernel_sources": len(list(cache.rglob("*.main.cpp")))}))


def _kind(builder) -> str:
    """What a C++ compiler run builds: a kernel, a precompiled header, or one of inductor's checks of the
    CPU's vector instructions (the same few tiny programs in every process that starts with an empty cache)."""
    target = str(builder.get_target_file_path())
    if target.endswith(".gch"):
        return "precompiled header"
    sources = [Path(s) for s in builder._sources_args.split() if s.endswith(".cpp")]
    return "vector ISA check" if any("_chk_kernel" in s.read_text() for s in sources if s.exists()) else (
        "kernel link" if not sources else "kernel")


def steady(modes: list[str], blocks: int, steps: int, rounds: int) -> None:
    """CPU and wall time per step of each variant, one process, blocks of ``steps`` steps in rotation."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    from compile_time import _median_ci, prepared

    variants = {mode: prepared(mode, blocks) for mode in modes}
    for step in variants.values():
        for _ in range(3):
            step()
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                variants[mode]()
            cpu[mode].append((time.process_time() - c0) / steps)
            wall[mode].append((time.perf_counter() - w0) / steps)
    for mode in modes:
        ratio = _median_ci([a / b for a, b in zip(cpu[mode], cpu[modes[0]])])
        wratio = _median_ci([a / b for a, b in zip(wall[mode], wall[modes[0]])])
        print(f"{mode}: CPU {statistics.median(cpu[mode]) * 1e3:.1f} ms/step, x{ratio[0]:.3f} "
              f"[{ratio[1]:.3f}-{ratio[2]:.3f}] of {modes[0]}; wall x{wratio[0]:.3f} [{wratio[1]:.3f}-{wratio[2]:.3f}]")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--modes", nargs="+", default=["whole", "regional"])
    parser.add_argument("--options", default="{}", help="JSON: TorchDynamoPlugin options for the regional variant")
    parser.add_argument("--steady", type=int, default=0, metavar="ROUNDS",
                        help="instead: steady-state step time of --modes in one process (the default cache)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--caches", action="store_true",
                        help="instead: the first --modes variant cold, again with the same cache folder, and in an "
                             "empty folder after loading the first run's mega-cache")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steady:
        steady(args.modes, args.blocks, args.steps, args.steady)
        return
    if args.child:
        child(args.child, args.blocks, json.loads(args.options), args.artifacts)
        return
    print(f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as work:
        if args.caches:
            blob = os.path.join(work, "mega-cache.bin")
            for label, cache in (("cold", "a"), ("second run, same folder", "a"), ("mega-cache, empty folder", "b")):
                print(label, end=": ", flush=True)
                _run(args.modes[0], args, os.path.join(work, cache), blob)
        else:
            for mode in args.modes:
                _run(mode, args, os.path.join(work, mode))
    print(f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)


def _run(mode: str, args: argparse.Namespace, cache: str, artifacts: str = "") -> None:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, __file__, "--child", mode, "--blocks", str(args.blocks),
                             "--options", args.options, "--artifacts", artifacts], env=env, capture_output=True,
                            text=True, timeout=3000)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    print(result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
