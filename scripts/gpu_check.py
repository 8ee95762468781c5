"""Run the parallel layouts on every GPU of this machine (NCCL) and compare each with one device.

    python scripts/gpu_check.py                 # one process per visible GPU
    python scripts/gpu_check.py --cpu --world 4 # the same logic on CPU processes over gloo

For each layout that fits the number of processes (DDP, FSDP2, HSDP, tensor parallel with and without
sequence parallel, FSDP2 x TP, context parallel, CP x TP) it trains a small transformer for ``--steps``
steps on a global batch of ``--batch`` sequences and prints the largest difference from the loss of the
same steps on one device, the peak memory per process and the step time. With one GPU it runs the
one-process layouts and context parallel over a mesh of one device. On the CPU, context parallel must
be refused before training (torch has no CPU attention rule for it): the script checks that it is.
Then the big-model dispatch check (scripts/gpu_check_big_model.py: a model over every GPU, the CPU and the
disk against one device). Exit status 1 when a layout or a check misses the tolerance or fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_throughput import (  # noqa: E402  (beside this script)
    add_arguments,
    add_process_arguments,
    free_port,
    process_count,
    start_worker,
)

VOCAB, DIM, HEADS, LAYERS = 256, 128, 8, 2


def build_model(seed: int = 0) -> Any:
    """examples/tiny_lm.py's model with a SwiGLU MLP and positions passed in (context parallel splits them)."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from tiny_lm import TinyLM

    torch.manual_seed(seed)
    return TinyLM(vocab=VOCAB, dim=DIM, n_heads=HEADS, layers=LAYERS, seq=1024, gated=True)


def batches(steps: int, batch: int, seq: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (steps, batch, seq + 1), generator=g)
    return [(step[:, :-1].contiguous(), step[:, 1:].contiguous()) for step in data]


def loss_of(model: Any, ids: Any, labels: Any, positions: Any) -> Any:
    import torch.nn.functional as F

    logits = model(ids, positions)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))


def reference(args: argparse.Namespace, device: Any) -> list[float]:
    """One device, plain PyTorch, the whole global batch."""
    import torch

    model = build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids, labels in batches(args.steps, args.batch, args.seq):
        ids, labels = ids.to(device), labels.to(device)
        positions = torch.arange(ids.shape[1], device=device).expand_as(ids).contiguous()
        loss = loss_of(model, ids, labels, positions)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def layouts(world: int) -> list[tuple[str, dict[str, Any]]]:
    """(name, settings) of the layouts that fit ``world`` processes."""
    if world == 1:
        return [("one process", {}), ("fsdp2 plugin, 1 process", {"fsdp": True}),
                ("context parallel over a 1-device mesh", {"cp_one_device": True})]
    found: list[tuple[str, dict[str, Any]]] = [("ddp", {}), (f"fsdp2 x{world}", {"dp_shard_size": world})]
    if world % 2 == 0:
        half = world // 2
        dp = f" x fsdp2={half}" if half > 1 else ""
        found += [(f"tp=2{dp}", {"tp_size": 2, "dp_shard_size": half}),
                  (f"tp=2 + sequence parallel{dp}", {"tp_size": 2, "dp_shard_size": half, "sp": True}),
                  (f"cp=2{dp}", {"cp_size": 2, "dp_shard_size": half})]
    if world % 4 == 0:
        quarter = world // 4
        dp = f" x fsdp2={quarter}" if quarter > 1 else ""
        found += [(f"hsdp 2 x {world // 2}", {"dp_replicate_size": 2, "dp_shard_size": world // 2}),
                  (f"cp=2 x tp=2{dp}", {"cp_size": 2, "tp_size": 2, "dp_shard_size": quarter})]
    if HEADS % world == 0 and world > 2:
        found.append((f"tp={world}", {"tp_size": world}))
    return found


def run_layout(name: str, settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from overdrive import Accelerator
    from overdrive.config import FullyShardedDataParallelPlugin, ParallelismConfig, TorchTensorParallelPlugin

    sizes = {k: v for k, v in settings.items() if k.endswith("_size")}
    kwargs: dict[str, Any] = {"cpu": args.cpu}
    if sizes:
        kwargs["parallelism_config"] = ParallelismConfig(
            **sizes, tp_handler=TorchTensorParallelPlugin(sequence_parallel=settings.get("sp", False)))
    if settings.get("fsdp"):
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()
    if settings.get("cp_one_device") and args.cpu:
        return {"skipped": "context parallel needs CUDA"}
    if settings.get("cp_size", 1) > 1 and args.cpu:
        try:
            Accelerator(**kwargs)
        except ValueError as exc:
            return {"skipped": f"refused on CPU as expected: {str(exc).splitlines()[-1].strip(' -')[:70]}..."}
        return {"error": "context parallel on CPU was not refused"}
    accelerator = Accelerator(**kwargs)
    device = accelerator.device
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    cp_mesh = _one_device_cp_mesh(device) if settings.get("cp_one_device") else None
    dp, dp_rank = accelerator.data_parallel_size, accelerator.data_parallel_rank
    per_rank = args.batch // dp
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for ids, labels in batches(args.steps, args.batch, args.seq):
        # the prepared loader's split, by hand: each data-parallel rank its slice of the global batch
        ids, labels = (t[dp_rank * per_rank:(dp_rank + 1) * per_rank].to(device) for t in (ids, labels))
        positions = torch.arange(ids.shape[1], device=device).expand_as(ids).contiguous()
        start = time.perf_counter()
        buffers = [ids, labels, positions]
        if cp_mesh is not None:
            from overdrive.transforms.context_parallel import context_parallel_region

            region = context_parallel_region(cp_mesh, buffers, [1, 1, 1], set(buffers))
        else:
            region = accelerator.maybe_context_parallel(buffers, [1, 1, 1], set(buffers))
        with region:
            loss = loss_of(model, ids, labels, positions)
            accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        # cp ranks hold different parts of the sequence (all count); tp peers the same loss (counted once)
        losses.append(accelerator.gather(loss.detach().reshape(1)).mean().item())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss()
    accelerator.free_memory()
    return {"losses": losses, "memory_mb": memory / 2**20, "step_ms": 1000 * sorted(times[1:] or times)[len(times) // 2]}


def _one_device_cp_mesh(device: Any) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(dist.get_default_backend_for_device(device), rank=0, world_size=1)
    return init_device_mesh(device.type, (1,), mesh_dim_names=("cp",))


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    start_worker(rank, world, port, args.cpu)
    import torch

    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank)
    expected = reference(args, device)
    failed = False
    rows = []
    for name, settings in layouts(world):
        try:
            result = run_layout(name, settings, args)
        except Exception:  # noqa: BLE001 - report every layout, then fail
            result = {"error": traceback.format_exc(limit=4)}
        if "losses" in result:
            diff = max(abs(a - b) for a, b in zip(result["losses"], expected))
            ok = diff <= args.tolerance and len(result["losses"]) == len(expected)
            failed |= not ok
            rows.append(f"| {name} | {'ok' if ok else 'FAIL'} | {diff:.2e} | {result['losses'][-1]:.4f} | "
                        f"{result['memory_mb']:.0f} | {result['step_ms']:.1f} |")
        else:
            failed |= "error" in result
            rows.append(f"| {name} | {'skipped' if 'skipped' in result else 'ERROR'} | "
                        f"{result.get('skipped') or result['error'].strip().splitlines()[-1]} | | | |")
    if rank == 0:
        kind = "CPU/gloo" if args.cpu else f"CUDA/NCCL ({torch.cuda.get_device_name(0)})"
        print(f"\n{world} process(es) on {kind}; reference final loss {expected[-1]:.4f}; tolerance {args.tolerance}")
        print("| layout | result | max abs loss diff | final loss | peak memory MB | step ms |\n|---|---|---|---|---|---|")
        print("\n".join(rows), flush=True)
    if not args.no_throughput:
        from gpu_throughput import throughput_table

        failed |= not throughput_table(world, rank, args)
    if failed:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_process_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=None)
    parser.add_argument("--no-throughput", action="store_true", help="skip the ~1B-parameter throughput table")
    add_arguments(parser)
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    world = process_count(args)
    if world is None:
        return 2
    # fp32 everywhere; on CUDA the reductions are ordered differently across layouts (and TF32 may be on)
    args.tolerance = args.tolerance or (1e-5 if args.cpu else 2e-3)
    try:
        mp.spawn(worker, args=(world, free_port(), args), nprocs=world, join=True)
    except Exception:  # noqa: BLE001 - a rank failed (its traceback is printed above)
        return 1
    # big-model dispatch over every GPU, the CPU and the disk (scripts/gpu_check_big_model.py)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_check_big_model

    return gpu_check_big_model.main(["--cpu"] if args.cpu else [])


if __name__ == "__main__":
    sys.exit(main())
