"""Training throughput of a ~1B-parameter transformer: overdrive against plain PyTorch making the same
``fully_shard`` / ``parallelize_module`` / torchao calls by hand. Run by ``scripts/gpu_check.py`` (or alone).

    python scripts/gpu_throughput.py                  # every GPU of this machine, the 1B model
    python scripts/gpu_throughput.py --cpu --world 2  # the same logic on 2 CPU processes, a tiny model

Layouts: FSDP2 over every process, and FSDP2 x tensor parallel (tp=2, when the process count is even);
precisions bf16 and fp8 (torchao float8, tensorwise; FSDP2 all-gathers the converted weights in float8).
overdrive: ``Accelerator(parallelism_config=..., mixed_precision=...)`` + ``prepare``. Plain: the model built
the same way, torchao's ``convert_to_float8_training`` with the same layer filter, the same column/row
tensor-parallel plan and ``fully_shard`` of each block then the root with the same ``MixedPrecisionPolicy``
(overdrive's decisions are read from the model it prepared, so both sides always do the same work).
Reported per row: tokens/s (global), overdrive/plain, MFU against the device's dense bf16 peak (also for
fp8 rows, as torchtitan reports it), peak memory. Exit status 1 when a row fails.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from typing import Any

SIZES = {  # ~0.95e9 parameters; the tiny one keeps every dimension divisible by 16 (fp8's rule)
    "1b": {"dim": 2048, "layers": 16, "heads": 16, "ffn": 5632, "vocab": 32000, "seq": 2048, "batch": 4},
    "tiny": {"dim": 64, "layers": 2, "heads": 4, "ffn": 128, "vocab": 256, "seq": 32, "batch": 2},
}


def build_model(size: dict[str, int]) -> Any:
    """examples/tiny_lm.py's model as Llama builds its blocks: RMSNorm, SwiGLU, no biases, no learned positions."""
    import sys

    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from tiny_lm import TinyLM

    torch.manual_seed(0)
    return TinyLM(vocab=size["vocab"], dim=size["dim"], n_heads=size["heads"], layers=size["layers"], seq=0,
                  ffn=size["ffn"], norm="rms", bias=False, gated=True)


def fp8_filter(model: Any) -> Any:
    """Accelerate's default, written out: every linear but the first and the last, dimensions divisible by 16."""
    from torch import nn

    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    skip = {names[0], names[-1]}
    return lambda m, fqn: fqn not in skip and m.in_features % 16 == 0 and m.out_features % 16 == 0


def prepare_plain(model: Any, precision: str, tp: int, sharded: bool, device: Any) -> tuple[Any, Any, Any]:
    """The same transforms as overdrive, by hand: fp8 conversion, tensor parallel, fully_shard per block."""
    import dataclasses

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = int(os.environ["WORLD_SIZE"])  # one process: overdrive starts no process group, init_device_mesh does
    model.to(device)
    if precision == "fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = dataclasses.replace(Float8LinearConfig(), pad_inner_dim=True, enable_fsdp_float8_all_gather=sharded)
        convert_to_float8_training(model, config=config, module_filter_fn=fp8_filter(model))
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp_shard", "tp"))
    if tp > 1:
        for block in model.layers:
            parallelize_module(block, mesh["tp"], {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                                                   "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
                                                   "gate": ColwiseParallel(), "up": ColwiseParallel(),
                                                   "down": RowwiseParallel()})
            block.attn.n_heads //= tp
    if sharded:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mesh=mesh["dp_shard"], mp_policy=policy)
        fully_shard(model, mesh=mesh["dp_shard"], mp_policy=MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    after_step = None
    if precision == "fp8" and sharded:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        def after_step() -> None:  # as overdrive does after each optimizer step
            precompute_float8_dynamic_scale_for_fsdp(model)
    return model, optimizer, after_step


def train(model: Any, optimizer: Any, size: dict[str, int], steps: int, device: Any, dp_rank: int,
          autocast: bool, backward: Any = None, after_step: Any = None) -> float:
    """Median seconds per step after 2 warm-up steps."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1 + dp_rank)
    times = []
    for step in range(steps + 2):
        ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, size["vocab"]), ids[:, 1:].reshape(-1))
        (backward or torch.Tensor.backward)(loss)
        optimizer.step()
        if after_step is not None:
            after_step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= 2:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run_row(layout: str, precision: str, tp: int, size: dict[str, int], steps: int, cpu: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.fsdp import FSDPModule

    from overdrive import Accelerator, AORecipeKwargs
    from overdrive.config import FullyShardedDataParallelPlugin, ParallelismConfig
    from overdrive.tracking.throughput import estimate_flops_per_token, peak_flops_for

    world = int(os.environ["WORLD_SIZE"])  # the Accelerator starts the process group
    kwargs: dict[str, Any] = {"cpu": cpu, "mixed_precision": precision}
    if precision == "fp8":
        kwargs["kwargs_handlers"] = [AORecipeKwargs()]
    if world == 1:
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin()
    else:
        kwargs["parallelism_config"] = ParallelismConfig(dp_shard_size=world // tp, tp_size=tp)
    accelerator = Accelerator(**kwargs)
    device = accelerator.device
    model = build_model(size)
    flops_per_token = estimate_flops_per_token(model, size["seq"], num_layers=size["layers"], hidden_size=size["dim"],
                                               exclude_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    sharded = any(isinstance(m, FSDPModule) for m in model.modules())
    layout_of_mine = _structure(model)
    dp, dp_rank = accelerator.data_parallel_size, accelerator.data_parallel_rank
    mine = train(model, optimizer, size, steps, device, dp_rank, autocast=False, backward=accelerator.backward)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    accelerator.free_memory()
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    plain_model, plain_optimizer, after_step = prepare_plain(build_model(size), precision, tp, sharded, device)
    if _structure(plain_model) != layout_of_mine:  # the two sides must do the same work
        raise RuntimeError(f"plain model differs from overdrive's: {_structure(plain_model)} != {layout_of_mine}")
    plain = train(plain_model, plain_optimizer, size, steps, device, dp_rank, autocast=not sharded,
                  after_step=after_step)
    del plain_model, plain_optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tokens = dp * size["batch"] * size["seq"]
    peak = peak_flops_for(torch.cuda.get_device_name(device), "bf16") if device.type == "cuda" else None

    def mfu(seconds: float) -> str:  # model FLOPs per second over the processes' dense bf16 peak
        return f"{100 * tokens / seconds * flops_per_token / (peak * world):.1f}%" if peak else "n/a"

    return {"layout": layout, "precision": precision, "mine": tokens / mine, "plain": tokens / plain,
            "mfu_mine": mfu(mine), "mfu_plain": mfu(plain), "memory_gib": memory, "sharded": sharded}


def _structure(model: Any) -> tuple[int, int, tuple]:
    """(fully_shard groups, float8 linear layers, each parameter's local shape): what both sides must share."""
    from torch.distributed.fsdp import FSDPModule

    float8 = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    shapes = tuple(tuple(getattr(p, "_local_tensor", p).shape) for p in model.parameters())
    return sum(isinstance(m, FSDPModule) for m in model.modules()), float8, shapes


def rows_for(world: int) -> list[tuple[str, int]]:
    found = [(f"fsdp2 x{world}", 1)]
    if world % 2 == 0:
        found.append((f"fsdp2 x{world // 2} + tp=2", 2))
    return found


def throughput_table(world: int, rank: int, args: argparse.Namespace) -> bool:
    """Run every row on this rank; rank 0 prints the table. Returns whether every row ran."""
    size = SIZES[args.size or ("tiny" if args.cpu else "1b")]
    ok, lines = True, []
    for layout, tp in rows_for(world):
        for precision in ("bf16", "fp8"):
            try:
                r = run_row(layout, precision, tp, size, args.throughput_steps, args.cpu)
                lines.append(f"| {layout} | {precision} | {r['mine']:,.0f} | {r['plain']:,.0f} | "
                             f"{r['mine'] / r['plain']:.3f} | {r['mfu_mine']} | {r['mfu_plain']} | "
                             f"{r['memory_gib']:.1f} |")
            except Exception:  # noqa: BLE001 - report every row, then fail
                ok = False
                lines.append(f"| {layout} | {precision} | ERROR: {traceback.format_exc(limit=3).strip().splitlines()[-1]}"
                             " | | | | | |")
    if rank == 0:
        print(f"\nthroughput: {size['layers']} layers x dim {size['dim']}, seq {size['seq']}, batch {size['batch']} "
              f"per data-parallel rank, {world} process(es), {args.throughput_steps} timed steps per row")
        print("| layout | precision | overdrive tokens/s | plain tokens/s | overdrive/plain | MFU overdrive | "
              "MFU plain | peak GiB (overdrive) |\n|---|---|---|---|---|---|---|---|")
        print("\n".join(lines), flush=True)
    return ok


def free_port() -> int:
    """A free local port for the rendezvous of the spawned processes."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_worker(rank: int, world: int, port: int, cpu: bool) -> None:
    """Give a spawned process torchrun's variables (the Accelerator starts the process group from them) and
    its device: one thread on the CPU, GPU ``rank`` otherwise."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    if cpu:
        os.environ["ACCELERATE_USE_CPU"] = "true"  # joins CPU processes into one run (as under Accelerate)
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    start_worker(rank, world, port, args.cpu)
    if not throughput_table(world, rank, args):
        raise SystemExit(1)


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo (tests the script's logic)")
    parser.add_argument("--world", type=int, default=None, help="processes (default: GPUs, or 2 with --cpu)")


def process_count(args: argparse.Namespace) -> int | None:
    """``--world``, else one process per GPU (2 with ``--cpu``); None, after saying why, without a GPU."""
    import sys

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu to check the logic on CPU processes", file=sys.stderr)
        return None
    return args.world or (2 if args.cpu else torch.cuda.device_count())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=sorted(SIZES), help="model size (default: 1b on GPUs, tiny with --cpu)")
    parser.add_argument("--throughput-steps", type=int, default=8, help="timed steps per throughput row")


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_process_arguments(parser)
    add_arguments(parser)
    args = parser.parse_args(argv)
    world = process_count(args)
    if world is None:
        return 2
    try:
        mp.spawn(_worker, args=(world, free_port(), args), nprocs=world, join=True)
    except Exception:  # noqa: BLE001 - a rank failed (its traceback is printed above)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
