"""Pipeline parallel (pp=2) against DDP and FSDP2 on the same model and global batch, and the bubble of
every pipeline schedule.

    .venv/bin/python bench/pipeline.py                 # the whole comparison, ~4 min on 2 CPU cores
    .venv/bin/python bench/pipeline.py --quick         # smaller model, fewer steps

Part 1 - layouts on 2 processes (gloo, one intra-op thread each), the model of bench/fsdp_memory.py
(embedding, ``--layers`` attention blocks, head), AdamW, the same global batch of ``2 x --batch``
sequences: DDP (each rank ``--batch``), FSDP2 (each rank ``--batch``) and a 2-stage 1F1B pipeline (each
rank sees the whole global batch, split into ``--microbatches``). Per rank: bytes of parameters,
gradients and optimizer state held (counted from the tensors), peak RSS during the steps (with
``MALLOC_MMAP_THRESHOLD_=131072``, as bench/fsdp_memory.py), and the median step time.

Part 2 - every schedule at pp=2 (2 stages per rank for the multi-stage ones), two bubble figures:

- "action list": computed from the schedule's own action list (``schedule.pipeline_order``): each rank
  runs its actions in order as soon as their inputs are ready, a forward, input-backward and
  weight-backward costing 1 and a full backward 2, communication free (``bubble_fraction``); the
  share of the step a rank computes nothing. (For 1F1B, whose list in torch is drawn for display and
  skips a forward, the standard 1F1B order.) Equals (p-1)/(m+p-1) for GPipe and 1F1B;
- "measured": ``1 - busy / step time`` per rank, with busy time measured around torch's per-micro-batch
  compute calls (``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``), so it
  includes the real costs (a backward takes about twice a forward) and the communication waits.

Writes markdown tables to stdout and the numbers to bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from memory_harness import MMAP_THRESHOLD, add_output_arguments, write_results  # noqa: E402
from memory_harness import free_port as _free_port
from memory_harness import local_bytes as _local_bytes
from memory_harness import rss as _rss
from memory_harness import transformer as _model  # noqa: E402

SCHEDULES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("LoopedBFS", 2), ("InterleavedZeroBubble", 2),
             ("ZBVZeroBubble", 2), ("DualPipeV", 2)]


def _accelerator(layout: str, args: argparse.Namespace) -> Any:
    import torch

    from overdrive import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig, PipelineConfig

    if layout == "ddp":
        return Accelerator(cpu=True)
    if layout == "fsdp2":
        return Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    name, _, spr = layout.partition(":")

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    config = PipelineConfig(schedule=name, stages_per_rank=int(spr or 1), num_microbatches=args.microbatches,
                            loss_fn=loss_fn)
    return Accelerator(cpu=True, parallelism_config=ParallelismConfig(pp_size=2, pp_handler=config))


class _BusyClock:
    """Time spent inside torch's per-micro-batch compute calls of pipeline stages, on this process."""

    def __init__(self) -> None:
        from torch.distributed.pipelining.stage import _PipelineStageBase

        self.busy = 0.0
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            original = getattr(_PipelineStageBase, name)
            setattr(_PipelineStageBase, name, self._timed(original))

    def _timed(self, original: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                self.busy += time.perf_counter() - start
        return call


def _worker(rank: int, world: int, port: int, layout: str, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    if not torch.accelerator.is_available():  # the CPU setting joins CPU processes (as under Accelerate)
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    torch.set_num_threads(1)
    clock = _BusyClock() if layout not in ("ddp", "fsdp2") else None
    accelerator = _accelerator(layout, args)
    model = _model(args.dim, args.layers, args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = args.batch * (world if clock else 1)  # a pipeline's ranks all see the whole global batch
    peak, running = [_rss()], [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    threading.Thread(target=sample, daemon=True).start()
    g = torch.Generator().manual_seed(accelerator.data_parallel_rank)
    times, busy, counted = [], [], {}
    for step in range(args.steps + 1):
        ids = torch.randint(0, args.vocab, (batch, args.seq), generator=g)
        before = clock.busy if clock else 0.0
        start = time.perf_counter()
        if clock:
            loss = model(ids, labels=ids).loss
        else:
            loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, args.vocab), ids.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        if step == args.steps:
            params = list(model.parameters())
            counted = {"params": sum(_local_bytes(p) for p in params),
                       "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
                       "optimizer": sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values()
                                        if isinstance(v, torch.Tensor) and v.ndim > 0)}
        optimizer.zero_grad()
        if step:  # the first step builds the schedule and runs its metadata pass
            times.append(time.perf_counter() - start)
            busy.append((clock.busy - before) if clock else 0.0)
    running[0] = False
    result = {**counted, "peak_rss": peak[0], "step_s": statistics.median(times),
              "busy_share": sum(busy) / sum(times)}
    if clock:
        from overdrive.transforms.pipeline.schedule import bubble_fraction, one_f_one_b_order

        schedule = next(iter(model._schedules.values()))
        order = one_f_one_b_order(2, args.microbatches) if layout == "1F1B:1" else schedule.pipeline_order
        result["action_list_bubble"] = bubble_fraction(order)[accelerator.mesh.rank("pp")]
    queue.put((rank, result))
    accelerator.wait_for_everyone()
    import torch.distributed as dist

    dist.destroy_process_group()


def run(layout: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, layout, args, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=args.timeout) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return [results[r] for r in range(2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8, help="sequences per data-parallel rank (DDP, FSDP2)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="dim 256, 4 layers, 2 steps")
    add_output_arguments(parser, "pipeline")
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.layers, args.steps, args.vocab = 256, 4, 2, 4096
    mb = 1 / 2**20
    layouts = {name: run(name, args) for name in ("ddp", "fsdp2", "1F1B:1")}
    print(f"2 processes, global batch {2 * args.batch}x{args.seq}, dim {args.dim}, {args.layers} blocks, "
          f"vocab {args.vocab}, AdamW; pipeline: 1F1B, {args.microbatches} micro-batches\n")
    print("| layout | rank | params MB | grads MB | optimizer MB | state MB | peak RSS MB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, per_rank in layouts.items():
        for rank, r in enumerate(per_rank):
            state = r["params"] + r["grads"] + r["optimizer"]
            print(f"| {'pp=2' if name == '1F1B:1' else name} | {rank} | {r['params'] * mb:.1f} | {r['grads'] * mb:.1f} | "
                  f"{r['optimizer'] * mb:.1f} | {state * mb:.1f} | {r['peak_rss'] * mb:.0f} | {r['step_s']:.3f} |")
    schedules = {name: run(f"{name}:{spr}", args) for name, spr in SCHEDULES}
    print(f"\nBubble per schedule (pp=2, {args.microbatches} micro-batches; rank 0 / rank 1)\n")
    print("| schedule | stages per rank | action list | measured (1 - busy/step) | step s |")
    print("|---|---|---|---|---|")
    for (name, spr), per_rank in zip(SCHEDULES, schedules.values()):
        listed = " / ".join(f"{r['action_list_bubble']:.2f}" for r in per_rank)
        measured = " / ".join(f"{1 - r['busy_share']:.2f}" for r in per_rank)
        step = max(r["step_s"] for r in per_rank)
        print(f"| {name} | {spr} | {listed} | {measured} | {step:.3f} |")
    write_results(args, layouts=layouts, schedules=schedules)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
