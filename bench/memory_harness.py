"""What the memory benchmarks share (fsdp_memory.py, zero_memory.py, pipeline.py): the transformer they
train, per-rank memory measurement (exact tensor bytes, RSS and its peak), timed training steps, and one
process group of ``--world`` CPU processes per layout.

Workers run with ``MALLOC_MMAP_THRESHOLD_=131072``: without it glibc keeps freed memory (e.g. the full
model each rank builds before sharding) and savings do not show in RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MMAP_THRESHOLD = "131072"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def transformer(dim: int, layers: int, vocab: int) -> Any:
    """A small causal transformer (embedding, ``layers`` attention + MLP blocks, head), seeded."""
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


def local_bytes(tensor: Any) -> int:
    """Bytes of ``tensor`` this rank holds (a DTensor counts its local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def rss() -> int:
    """This process's resident memory in bytes."""
    import psutil

    return psutil.Process().memory_info().rss


@contextmanager
def peak_rss(every: float = 0.002) -> Iterator[list[int]]:
    """Sample RSS every ``every`` seconds while the block runs; ``[peak]`` holds the highest value."""
    peak = [rss()]
    running = [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], rss())
            time.sleep(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        running[0] = False
        thread.join()


def timed_steps(accelerator: Any, model: Any, optimizer: Any, args: Any, rank: int,
                before_zero_grad: Callable[[int], None] | None = None) -> tuple[list[float], list[float]]:
    """``args.steps + 1`` training steps on random tokens (``args.batch`` x ``args.seq``): the times of all
    but the first (warm-up) step and every loss. ``before_zero_grad(step)`` runs while gradients are held."""
    import torch

    g = torch.Generator().manual_seed(rank)
    times, losses = [], []
    for step in range(args.steps + 1):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        start = time.perf_counter()
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), ids.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        if before_zero_grad is not None:
            before_zero_grad(step)
        optimizer.zero_grad()
        if step:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return times, losses


def prepare_transformer(accelerator: Any, args: Any) -> tuple[Any, Any, int]:
    """The transformer of ``args.dim`` / ``args.layers`` / ``args.vocab`` and an AdamW (lr 1e-4) over it,
    prepared by ``accelerator``, and its parameter count."""
    import torch

    model = transformer(args.dim, args.layers, args.vocab)
    num_params = sum(p.numel() for p in model.parameters())
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    return model, optimizer, num_params


def measured_steps(accelerator: Any, model: Any, optimizer: Any, args: Any, rank: int,
                   before_zero_grad: Callable[[int], None] | None = None) -> dict[str, Any]:
    """RSS now (after setup), then :func:`timed_steps` with the RSS peak sampled: ``setup_rss``,
    ``peak_rss``, ``step_s`` (the median step) and ``losses``."""
    setup_rss = rss()
    with peak_rss() as peak:
        times, losses = timed_steps(accelerator, model, optimizer, args, rank, before_zero_grad=before_zero_grad)
    return {"setup_rss": setup_rss, "peak_rss": peak[0], "step_s": statistics.median(times), "losses": losses}


def join_group(rank: int, world: int, port: int, **extra: str) -> None:
    """The environment torchrun would give rank ``rank`` of ``world``, and one intra-op thread."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra)
    import torch

    if not torch.accelerator.is_available():  # the CPU setting joins CPU processes (as under Accelerate)
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    torch.set_num_threads(1)


def leave_group(accelerator: Any) -> None:
    """Wait for every rank, then close the process group."""
    accelerator.wait_for_everyone()
    import torch.distributed as dist

    dist.destroy_process_group()


def run_layout(worker: Callable[..., None], layout: str, args: Any) -> list[dict[str, Any]]:
    """Run ``worker(rank, world, port, layout, args, queue)`` on ``args.world`` spawned processes; each
    puts ``(rank, result)`` on the queue. The results in rank order."""
    import torch.multiprocessing as mp

    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD  # read by glibc when each worker starts
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args.world, port, layout, args, queue)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=args.timeout) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return [results[r] for r in range(args.world)]


def median(values: list[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of fsdp_memory.py and zero_memory.py: ranks, the transformer's size, the batch, the steps."""
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """``--timeout`` (seconds to wait for a layout's ranks) and ``--output`` (default bench/results/NAME.json)."""
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / f"{name}.json"))


def write_results(args: argparse.Namespace, **sections: Any) -> None:
    """Write ``{"args": ..., **sections}`` as JSON to ``args.output``."""
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), **sections}, indent=2))
