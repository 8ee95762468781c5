"""Big-model loading and disk-offload generation: overdrive against Accelerate, same checkpoint, same run.

    .venv/bin/python bench/big_model.py                 # ~540 MB fp32 Llama, 3 rounds (~5 min on 2 cores)
    .venv/bin/python bench/big_model.py --quick         # ~140 MB model, 2 rounds
    .venv/bin/python bench/big_model.py --rounds 0      # the memory table alone (1, 2 and 4 processes)

One Llama-style model (transformers, built from a config with a fixed seed, untied head) is saved once
as sharded safetensors (``--shard`` MB shards) in a temporary folder. Then, round after round and in
alternating order, a fresh interpreter per measurement runs, for each contender (overdrive's
``overdrive.big_model``, the real ``accelerate``):

- **load**: ``init_empty_weights`` + ``load_checkpoint_and_dispatch(model, folder, device_map={"": "cpu"})``:
  wall time of that call, and peak resident memory above the level just before it (sampled every 2 ms
  from /proc/self/statm; ``MALLOC_MMAP_THRESHOLD_=131072`` so that freed memory shows); then the resident
  memory after one forward (both leave the weights in the safetensors files' mappings, zero-copy: they
  become resident only when read);
- **generate**: the same load with the second half of the decoder layers mapped to ``"disk"`` (offload
  folder in the same temporary folder), then greedy ``generate`` of ``--new-tokens`` tokens after a
  prompt of 16 (one untimed warm-up generation first): tokens per second.

- **memory** (after the rounds; ``--ranks``, default 1,2,4): N processes of one contender start together,
  import and build the empty model, report their /proc/self/smaps_rollup, wait for the parent's go, load
  to the CPU (peak private = anonymous and peak file-backed resident memory, from statm every 2 ms), run
  one forward and report again. Per contender and N: the private (``Anonymous``) and file-backed
  (``Rss - Anonymous``: page cache pages, shared and reclaimable) memory above the level after imports
  (and the part of the private memory after the load that is the contender's loading code, imported when
  ``load_checkpoint_and_dispatch`` is first looked up: overdrive imports it then, Accelerate with the
  package), the sum of the processes' PSS increases (each shared page counted once across them: what N
  processes add to the machine; the parent reads every process's PSS at one moment once all are ready
  and once all are done, since a page's share depends on how many processes map it when it is read) and
  the machine's used memory (MemTotal - MemAvailable) from the go to the last forward (other processes on
  a shared machine move it by hundreds of MB).

The checkpoint files are read once before the rounds so both contenders find them in the page cache, and
overdrive's modules are compiled to bytecode first, as pip compiled Accelerate's when installing it.
Targets (issue 13): peak load memory <= model size + largest shard + 10%; overdrive's load time and
generation speed at least Accelerate's. Issue 25: private memory after the load <= 10% of the model; 4
processes <= 1.2x the memory of 1. Prints the tables and writes bench/results/big_model.json.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"full": dict(hidden=768, intermediate=2048, layers=12, vocab=32000),
         "quick": dict(hidden=384, intermediate=1024, layers=8, vocab=32000)}


def _config(size: dict[str, int]) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                       num_hidden_layers=size["layers"], num_attention_heads=12 if size["hidden"] % 12 == 0 else 8,
                       num_key_value_heads=4, tie_word_embeddings=False, max_position_embeddings=512)


def _statm() -> tuple[int, int]:
    """(resident, resident and file-backed) bytes of this process, from /proc/self/statm (cheap)."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    page = os.sysconf("SC_PAGE_SIZE")
    return int(fields[1]) * page, int(fields[2]) * page


def _rss() -> int:
    return _statm()[0]


def _smaps(pid: int | str = "self") -> dict[str, int]:
    """A process's /proc/<pid>/smaps_rollup totals in bytes (Rss, Pss, Anonymous, Private_Dirty...)."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return values


def _machine_used() -> int:
    """Machine-wide used memory: MemTotal - MemAvailable (the page cache's reclaimable part left out)."""
    info = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            key, value = line.split(":")
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class PeakRSS:
    """Peak resident memory while the block runs, sampled every 2 ms: in all, private (anonymous) and
    file-backed (page cache pages mapped by this process: shared, reclaimable)."""

    def __enter__(self) -> PeakRSS:
        self.start, self.start_file = _statm()
        self.peak, self.peak_private, self.peak_file = self.start, self.start - self.start_file, self.start_file
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _take(self) -> None:
        rss, file = _statm()
        self.peak, self.peak_private, self.peak_file = (max(self.peak, rss), max(self.peak_private, rss - file),
                                                        max(self.peak_file, file))

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._take()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._take()


def _library(contender: str) -> Any:
    if contender == "overdrive":
        from overdrive import big_model as library
    else:
        import accelerate as library  # the real package: no install_as_accelerate in this process
        from accelerate.utils import modeling  # noqa: F401
    return library


def _empty_model(library: Any, size: dict[str, int]) -> Any:
    from transformers import LlamaForCausalLM

    with library.init_empty_weights():
        model = LlamaForCausalLM(_config(size))
    return model.eval()


def worker(contender: str, task: str, folder: str, size: dict[str, int], new_tokens: int) -> dict[str, Any]:
    import torch

    library = _library(contender)
    model = _empty_model(library, size)
    layers = size["layers"]
    if task == "load":
        device_map: dict[str, Any] = {"": "cpu"}
        offload = None
    else:
        device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
        device_map |= {f"model.layers.{i}": "cpu" if i < layers // 2 else "disk" for i in range(layers)}
        offload = tempfile.mkdtemp(dir=folder, prefix=f"offload-{contender}-")
    with PeakRSS() as memory:
        start = time.perf_counter()
        # overdrive's offload_in_place switch: "disk" weights indexed in the safetensors shards, not copied
        extra = {"offload_in_place": True} if contender == "overdrive" and offload else {}
        model = library.load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=offload,
                                                     **extra)
        load_s = time.perf_counter() - start
    result: dict[str, Any] = {"load_s": load_s, "peak_rss_above_start": memory.peak - memory.start}
    if task == "load":
        # a zero-copy load (weights left in a file mapping) only becomes resident when the weights are read:
        # one forward makes both contenders' real memory cost show
        with torch.no_grad():
            model(torch.zeros(1, 4, dtype=torch.long))
        result["rss_after_forward_above_start"] = _rss() - memory.start
    if task == "generate":
        prompt = torch.randint(0, size["vocab"], (1, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
            start = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                 min_new_tokens=new_tokens)
            seconds = time.perf_counter() - start
        result |= {"tokens_per_s": (out.shape[1] - prompt.shape[1]) / seconds, "tokens": out[0].tolist()}
    return result


def ranks_worker(contender: str, folder: str, size: dict[str, int]) -> None:
    """One of N processes loading the same checkpoint to the CPU at once: report smaps_rollup after
    imports ("ready"), wait for the parent's go, load, run one forward, report again ("done"), wait to exit."""
    import torch

    library = _library(contender)
    model = _empty_model(library, size)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    print("ready " + json.dumps(_smaps()), flush=True)
    sys.stdin.readline()
    with PeakRSS() as memory:
        start = time.perf_counter()
        load = library.load_checkpoint_and_dispatch  # overdrive imports its loading code here, on first use
        imported = _smaps()  # (Accelerate imported all of its code with the package, before "ready")
        model = load(model, folder, device_map={"": "cpu"})
        load_s = time.perf_counter() - start
    loaded = _smaps()
    with torch.no_grad():
        model(tokens)
    after = _smaps()
    print("done " + json.dumps({**after, "imported": imported, "loaded": loaded, "load_s": load_s,
                                "peak_rss": memory.peak - memory.start,
                                "peak_private": memory.peak_private - (memory.start - memory.start_file),
                                "peak_file": memory.peak_file - memory.start_file}), flush=True)
    sys.stdin.readline()


def _run_ranks(contender: str, ranks: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """N processes of one contender loading to the CPU together: their memory above the level after imports,
    and the machine's used memory (MemTotal - MemAvailable) before the go and once all have run a forward."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--ranks-worker", contender, str(folder), "--size", args.size]
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(ranks)]

    def message(proc: subprocess.Popen, tag: str) -> dict[str, Any]:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
        raise RuntimeError(f"{contender} rank exited (code {proc.wait()}) before saying {tag!r}")

    try:
        ready = [message(proc, "ready") for proc in procs]
        time.sleep(0.5)
        # every process's PSS read at one moment, before the go and once all are done: a page's PSS share
        # depends on how many processes map it at that moment, so a process reading its own when it is
        # done, before slower ones have mapped the weights, counts the shared pages as its own
        settled = [_smaps(proc.pid) for proc in procs]
        used_before = _machine_used()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        done = [message(proc, "done") for proc in procs]
        finished = [_smaps(proc.pid) for proc in procs]
        used_after = _machine_used()
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=120)

    def above(key: str) -> list[int]:
        return [after[key] - before[key] for before, after in zip(ready, done)]

    return {"ranks": ranks, "load_s": max(d["load_s"] for d in done),
            "peak_private": max(d["peak_private"] for d in done), "peak_file": max(d["peak_file"] for d in done),
            "private_of_code": max(d["imported"]["Anonymous"] - r["Anonymous"] for r, d in zip(ready, done)),
            "private_after_load": max(d["loaded"]["Anonymous"] - r["Anonymous"] for r, d in zip(ready, done)),
            "private_of_forward": max(d["Anonymous"] - d["loaded"]["Anonymous"] for d in done),
            "private_of_forward_sum": sum(d["Anonymous"] - d["loaded"]["Anonymous"] for d in done),
            "private_after": max(above("Anonymous")),
            "file_after": max(r - a for r, a in zip(above("Rss"), above("Anonymous"))),
            "pss_sum": sum(f["Pss"] - s["Pss"] for s, f in zip(settled, finished)),
            "pss_sum_own_times": sum(above("Pss")),  # each process's own reading at "ready" and at "done"
            "machine_used": used_after - used_before}


def _anonymous_by_mapping(pid: int) -> dict[str, int]:
    """A process's private (``Anonymous``) memory in bytes by kind of mapping, from /proc/<pid>/smaps."""
    kinds: dict[str, int] = {}
    kind, previous_file, previous_end = "", "", ""
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode [name]
                start, end = fields[0].split("-")
                name = fields[5] if len(fields) > 5 else ""
                if name.startswith("/"):
                    kind = f"written pages of {Path(name).name}"  # copy-on-write copies of a file's pages
                elif name:
                    kind = {"[heap]": "malloc heap (glibc's main arena)"}.get(name, name)
                elif start == previous_end and previous_file:
                    kind = f"anonymous after {previous_file} (its zero-initialised data, usually)"
                elif "x" in fields[1]:
                    kind = "executable anonymous (ctypes callbacks, JIT code)"
                else:
                    kind = "other anonymous (Python's object arenas, large malloc blocks, thread stacks)"
                previous_file = Path(name).name if name.startswith("/") else previous_file if not name else ""
                previous_end = end
            elif fields[0] == "Anonymous:":
                kinds[kind] = kinds.get(kind, 0) + int(fields[1]) * 1024
    return kinds


def attribute_worker(contender: str, folder: str, size: dict[str, int]) -> None:
    """One process, stopping at each step for the parent to read its /proc/<pid>/smaps: after imports and the
    empty model, after looking up the loading function (overdrive imports its loading code then), after the
    load to the CPU, after one forward."""
    import torch

    def step(name: str) -> None:
        print(f"step {name}", flush=True)
        sys.stdin.readline()

    library = _library(contender)
    model = _empty_model(library, size)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    step("ready")
    load = library.load_checkpoint_and_dispatch
    step("code imported")
    model = load(model, folder, device_map={"": "cpu"})
    step("loaded")
    with torch.no_grad():
        model(tokens)
    step("forward")


def _attribute(contender: str, folder: Path, args: argparse.Namespace) -> dict[str, dict[str, int]]:
    """What each step of ``attribute_worker`` adds to the private memory, by kind of mapping (bytes)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--attribute-worker", contender, str(folder), "--size", args.size]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    readings = []
    for line in proc.stdout:
        if line.startswith("step "):
            readings.append((line[5:].strip(), _anonymous_by_mapping(proc.pid)))
            proc.stdin.write("\n")
            proc.stdin.flush()
    if proc.wait(timeout=120) != 0:
        raise RuntimeError(f"{contender} attribution worker failed (code {proc.returncode})")
    steps = {}
    for (_, before), (name, after) in zip(readings, readings[1:]):
        added = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in sorted({*before, *after})}
        steps[name] = {kind: value for kind, value in added.items() if value}
    return steps


def _attribution_table(attribution: dict[str, dict[str, dict[str, int]]]) -> str:
    lines = ["| contender | step | mapping | private added (kB) |", "|---|---|---|---:|"]
    for contender, steps in attribution.items():
        for step, kinds in steps.items():
            for kind, value in sorted(kinds.items(), key=lambda item: -abs(item[1])):
                lines.append(f"| {contender} | {step} | {kind} | {value / 1024:.0f} |")
            lines.append(f"| {contender} | {step} | **all** | **{sum(kinds.values()) / 1024:.0f}** |")
    return "\n".join(lines)


def _save_checkpoint(folder: Path, size: dict[str, int], shard_mb: int) -> dict[str, int]:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(size))
    model.save_pretrained(folder, max_shard_size=f"{shard_mb}MB")
    shards = sorted(folder.glob("*.safetensors"))
    for shard in shards:  # into the page cache, for both contenders alike
        shard.read_bytes()
    return {"model_bytes": sum(p.numel() * p.element_size() for p in model.state_dict().values()),
            "largest_shard_bytes": max(s.stat().st_size for s in shards), "num_shards": len(shards),
            "parameters": sum(p.numel() for p in model.parameters())}


def _run_worker(contender: str, task: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, __file__, "--worker", contender, task, str(folder), "--size", args.size,
               "--new-tokens", str(args.new_tokens)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{contender} {task} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(summary: dict[str, Any], facts: dict[str, int]) -> str:
    mb = 1e6
    o, a = summary["overdrive"], summary["accelerate"]
    budget = (facts["model_bytes"] + facts["largest_shard_bytes"]) * 1.1
    rows = [
        "| measure | overdrive | Accelerate | overdrive / Accelerate |",
        "|---|---:|---:|---:|",
        f"| load on CPU, wall time (s) | {o['load_s']:.2f} | {a['load_s']:.2f} | {o['load_s'] / a['load_s']:.2f} |",
        f"| load on CPU, peak RSS above start (MB) | {o['peak_rss'] / mb:.0f} | {a['peak_rss'] / mb:.0f} | "
        f"{o['peak_rss'] / a['peak_rss']:.2f} |",
        f"| RSS after one forward, above start (MB) | {o['rss_after_forward'] / mb:.0f} | "
        f"{a['rss_after_forward'] / mb:.0f} | {o['rss_after_forward'] / a['rss_after_forward']:.2f} |",
        f"| generate, half the layers on disk (tokens/s) | {o['tokens_per_s']:.2f} | {a['tokens_per_s']:.2f} | "
        f"{o['tokens_per_s'] / a['tokens_per_s']:.2f} |",
        f"| load with half on disk, wall time (s) | {o['offload_load_s']:.2f} | {a['offload_load_s']:.2f} | "
        f"{o['offload_load_s'] / a['offload_load_s']:.2f} |",
    ]
    notes = (f"\nmodel {facts['model_bytes'] / mb:.0f} MB in {facts['num_shards']} shards (largest "
             f"{facts['largest_shard_bytes'] / mb:.0f} MB); memory budget model + largest shard + 10% = "
             f"{budget / mb:.0f} MB: overdrive {'within' if o['peak_rss'] <= budget else 'OVER'}, Accelerate "
             f"{'within' if a['peak_rss'] <= budget else 'over'}")
    return "\n".join(rows) + notes


def _memory_table(rows: dict[str, dict[int, dict[str, Any]]], facts: dict[str, int]) -> str:
    mb, model = 1e6, facts["model_bytes"]
    lines = ["| processes | contender | load (s) | peak private (MB) | peak file-backed (MB) | private after load (MB) | "
             "of which code imported on first use (MB) | private after forward (MB, % of model) | "
             "of which the forward's (MB) | file-backed after forward (MB) | PSS sum of all processes (MB) | "
             "machine used (MB) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ranks in sorted({r for by in rows.values() for r in by}):
        for contender in ("overdrive", "accelerate"):
            r = rows[contender][ranks]
            lines.append(f"| {ranks} | {contender} | {r['load_s']:.2f} | {r['peak_private'] / mb:.0f} | "
                         f"{r['peak_file'] / mb:.0f} | {r.get('private_after_load', 0) / mb:.1f} | "
                         f"{r.get('private_of_code', 0) / mb:.1f} | "
                         f"{r['private_after'] / mb:.1f} ({100 * r['private_after'] / model:.0f}%) | "
                         f"{r.get('private_of_forward', 0) / mb:.1f} | "
                         f"{r['file_after'] / mb:.0f} | {r['pss_sum'] / mb:.1f} | {r['machine_used'] / mb:.0f} |")
    notes = []
    for contender in ("overdrive", "accelerate"):
        by = rows[contender]
        if 1 in by and max(by) > 1:
            top = max(by)
            # what the loads leave: each process's own forward work memory (activations, torch's first-run
            # caches: the same with any loader) taken out
            loads = {n: by[n]["pss_sum"] - by[n].get("private_of_forward_sum", 0) for n in (1, top)}
            own = by[top]["pss_sum_own_times"] / by[1]["pss_sum_own_times"]
            notes.append(f"{contender}: {top} processes / 1 process: PSS sum x{by[top]['pss_sum'] / by[1]['pss_sum']:.2f} "
                         f"(x{own:.2f} from each process's own readings), "
                         f"without each process's forward work memory x{loads[top] / loads[1]:.2f}, "
                         f"machine used {by[1]['machine_used'] / 1e6:.0f} -> {by[top]['machine_used'] / 1e6:.0f} MB")
    return "\n".join(lines) + "\n" + "; ".join(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~140 MB model and 2 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--shard", type=int, default=100, help="shard size in MB")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--size", default=None, choices=list(SIZES))
    parser.add_argument("--out", default=None)
    parser.add_argument("--ranks", default="1,2,4", help="process counts for the memory table ('' to skip it)")
    parser.add_argument("--worker", nargs=3, metavar=("CONTENDER", "TASK", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--ranks-worker", nargs=2, metavar=("CONTENDER", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--attribute", action="store_true",
                        help="also split one process's private memory by mapping at each step (/proc/<pid>/smaps)")
    parser.add_argument("--attribute-worker", nargs=2, metavar=("CONTENDER", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = args.size or ("quick" if args.quick else "full")
    if args.ranks_worker:
        ranks_worker(*args.ranks_worker, SIZES[args.size])
        return
    if args.attribute_worker:
        attribute_worker(*args.attribute_worker, SIZES[args.size])
        return
    if args.worker:
        contender, task, folder = args.worker
        print(json.dumps(worker(contender, task, folder, SIZES[args.size], args.new_tokens)))
        return
    rounds = (2 if args.quick else 3) if args.rounds is None else args.rounds
    samples: dict[str, dict[str, list[float]]] = {c: {} for c in ("overdrive", "accelerate")}
    tokens: dict[str, list[int]] = {}
    memory_rows: dict[str, dict[int, dict[str, Any]]] = {}
    load_avg_start = os.getloadavg()
    # Accelerate's modules were compiled to bytecode by pip when it was installed; overdrive runs from its
    # source tree (an editable install). Compile its modules the same way first: with PYTHONDONTWRITEBYTECODE
    # set (as on the development machine), each worker would otherwise compile them from source at import,
    # which leaves ~1.4 MB of heap in each process and adds to its load time
    compileall.compile_dir(ROOT / "src" / "overdrive", quiet=1)
    with tempfile.TemporaryDirectory(prefix="bench-big-model-") as tmp:
        folder = Path(tmp)
        facts = _save_checkpoint(folder, SIZES[args.size], args.shard)
        for round_index in range(rounds):
            order = ["overdrive", "accelerate"] if round_index % 2 == 0 else ["accelerate", "overdrive"]
            for task in ("load", "generate"):
                for contender in order:
                    result = _run_worker(contender, task, folder, args)
                    bucket = samples[contender]
                    if task == "load":
                        bucket.setdefault("load_s", []).append(result["load_s"])
                        bucket.setdefault("peak_rss", []).append(result["peak_rss_above_start"])
                        bucket.setdefault("rss_after_forward", []).append(result["rss_after_forward_above_start"])
                    else:
                        bucket.setdefault("offload_load_s", []).append(result["load_s"])
                        bucket.setdefault("tokens_per_s", []).append(result["tokens_per_s"])
                        tokens[contender] = result["tokens"]
                    print(f"round {round_index + 1} {task:8s} {contender:10s} "
                          f"{json.dumps({k: v for k, v in result.items() if k != 'tokens'})}", flush=True)
        for ranks in [int(n) for n in args.ranks.split(",") if n]:
            for contender in ("overdrive", "accelerate") if ranks % 2 else ("accelerate", "overdrive"):
                result = _run_ranks(contender, ranks, folder, args)
                memory_rows.setdefault(contender, {})[ranks] = result
                print(f"ranks {ranks} {contender:10s} {json.dumps(result)}", flush=True)
        attribution = {c: _attribute(c, folder, args) for c in ("overdrive", "accelerate")} if args.attribute else {}
    summary = {c: {k: statistics.median(v) for k, v in bucket.items()} for c, bucket in samples.items()}
    table = _table(summary, facts) if rounds else f"model {facts['model_bytes'] / 1e6:.0f} MB ({facts['num_shards']} shards)"
    if memory_rows:
        table += "\n\n" + _memory_table(memory_rows, facts)
    if attribution:
        table += "\n\n" + _attribution_table(attribution)
    print("\n" + table)
    if tokens:
        print(f"same greedy tokens: {tokens['overdrive'] == tokens['accelerate']}")
    import accelerate
    import torch
    import transformers

    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "facts": facts, "median": summary,
              "samples": samples, "memory": memory_rows, "attribution": attribution, "same_tokens": tokens.get("overdrive") == tokens.get("accelerate"), "table": table,
              "versions": {"torch": torch.__version__, "accelerate": accelerate.__version__,
                           "transformers": transformers.__version__, "python": platform.python_version()},
              "cpus": os.cpu_count(), "load_avg": {"start": load_avg_start, "end": os.getloadavg()}}
    out = Path(args.out or ROOT / "bench" / "results" / f"big_model{'_quick' if args.quick else ''}.json")
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
