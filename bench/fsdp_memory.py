"""Per-rank memory of training state under FSDP2 against DDP, on the same model, and the step time.

    .venv/bin/python bench/fsdp_memory.py                      # 2 ranks, ~50M parameters, AdamW
    .venv/bin/python bench/fsdp_memory.py --world 4 --dim 512 --layers 4 --steps 5

Each layout runs in its own group of ``--world`` processes (gloo on 127.0.0.1, one intra-op thread each)
through ``overdrive.Accelerator``: DDP is ``Accelerator()``, FSDP2 is
``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())``. Reported per rank:

- the bytes of parameters, gradients and optimizer state this rank holds after a step, counted exactly
  from the tensors (a DTensor counts its local shard): FSDP2 should hold about 1/world of DDP's;
- resident memory (RSS) after setup, and its peak during the training steps (sampled every 2 ms).
  The workers run with ``MALLOC_MMAP_THRESHOLD_=131072``: without it glibc keeps freed memory
  (e.g. the full model each rank builds before sharding) and the saving does not show in RSS;
- the median time of a training step after one warm-up step.

Writes a markdown table to stdout and the numbers to bench/results/fsdp_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

MMAP_THRESHOLD = "131072"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model(dim: int, layers: int, vocab: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.heads = max(1, dim // 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            h = self.norm1(x)
            q, k, v = (p(h).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, dim))
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(0)
    return Model()


def _local_bytes(tensor: Any) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _worker(rank: int, world: int, port: int, layout: str, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    from overdrive import Accelerator
    from overdrive.config import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin() if layout == "fsdp2" else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = _model(args.dim, args.layers, args.vocab)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    setup_rss = _rss()
    peak = [setup_rss]
    running = [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    g = torch.Generator().manual_seed(rank)
    times, counted = [], {}
    for step in range(args.steps + 1):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        start = time.perf_counter()
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), ids.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        if step == args.steps:  # count the state at rest, gradients still held
            params = list(accelerator.unwrap_model(model).parameters())
            counted = {
                "params": sum(_local_bytes(p) for p in params),
                "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values()
                                 if isinstance(v, torch.Tensor) and v.ndim > 0),
            }
        optimizer.zero_grad()
        if step:
            times.append(time.perf_counter() - start)
    running[0] = False
    thread.join()
    queue.put((rank, {**counted, "num_params": num_params, "setup_rss": setup_rss, "peak_rss": peak[0],
                      "step_s": statistics.median(times)}))
    accelerator.wait_for_everyone()
    import torch.distributed as dist

    dist.destroy_process_group()


def run_layout(layout: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD  # read by glibc when each worker starts
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, args.world, port, layout, args, queue)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=args.timeout) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return [results[r] for r in range(args.world)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "fsdp_memory.json"))
    args = parser.parse_args(argv)

    mb = 1 / 2**20
    rows, everything = [], {}
    for layout in ("ddp", "fsdp2"):
        per_rank = run_layout(layout, args)
        everything[layout] = per_rank
        worst = max(per_rank, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        rows.append((layout, worst, max(r["peak_rss"] for r in per_rank), statistics.median(
            r["step_s"] for r in per_rank)))
    num_params = rows[0][1]["num_params"]
    print(f"{num_params / 1e6:.1f}M parameters, AdamW, {args.world} ranks, batch {args.batch}x{args.seq} per rank, "
          f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}\n")
    print("| layout | params MB | grads MB | optimizer MB | state total MB | RSS after setup MB | "
          "peak RSS in steps MB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for layout, r, peak, step in rows:
        total = r["params"] + r["grads"] + r["optimizer"]
        print(f"| {layout} | {r['params'] * mb:.1f} | {r['grads'] * mb:.1f} | {r['optimizer'] * mb:.1f} | "
              f"{total * mb:.1f} | {r['setup_rss'] * mb:.0f} | {peak * mb:.0f} | {step:.3f} |")
    ddp, fsdp = (r[1]["params"] + r[1]["grads"] + r[1]["optimizer"] for r in rows)
    print(f"\nFSDP2 / DDP state per rank: {fsdp / ddp:.3f} (1/{args.world} = {1 / args.world:.3f})")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "per_rank": everything}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
