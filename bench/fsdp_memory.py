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
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import memory_harness as harness  # noqa: E402 - the harness the memory benchmarks share


def _worker(rank: int, world: int, port: int, layout: str, args: argparse.Namespace, queue: Any) -> None:
    harness.join_group(rank, world, port)
    import torch

    from overdrive import Accelerator
    from overdrive.config import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin() if layout == "fsdp2" else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model, optimizer, num_params = harness.prepare_transformer(accelerator, args)
    counted: dict[str, int] = {}
    local_bytes = harness.local_bytes

    def count(step: int) -> None:
        if step == args.steps:  # count the state at rest, gradients still held
            params = list(accelerator.unwrap_model(model).parameters())
            counted.update(
                params=sum(local_bytes(p) for p in params),
                grads=sum(local_bytes(p.grad) for p in params if p.grad is not None),
                optimizer=sum(local_bytes(v) for state in optimizer.state.values() for v in state.values()
                              if isinstance(v, torch.Tensor) and v.ndim > 0))

    measured = harness.measured_steps(accelerator, model, optimizer, args, rank, before_zero_grad=count)
    queue.put((rank, {**counted, "num_params": num_params, **measured}))
    harness.leave_group(accelerator)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_model_arguments(parser)
    harness.add_output_arguments(parser, "fsdp_memory")
    args = parser.parse_args(argv)

    mb = 1 / 2**20
    rows, everything = [], {}
    for layout in ("ddp", "fsdp2"):
        per_rank = harness.run_layout(_worker, layout, args)
        everything[layout] = per_rank
        worst = max(per_rank, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        rows.append((layout, worst, max(r["peak_rss"] for r in per_rank), statistics.median(
            r["step_s"] for r in per_rank)))
    num_params = rows[0][1]["num_params"]
    print(f"{num_params / 1e6:.1f}M parameters, AdamW, {args.world} ranks, batch {args.batch}x{args.seq} per rank, "
          f"MALLOC_MMAP_THRESHOLD_={harness.MMAP_THRESHOLD}\n")
    print("| layout | params MB | grads MB | optimizer MB | state total MB | RSS after setup MB | "
          "peak RSS in steps MB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for layout, r, peak, step in rows:
        total = r["params"] + r["grads"] + r["optimizer"]
        print(f"| {layout} | {r['params'] * mb:.1f} | {r['grads'] * mb:.1f} | {r['optimizer'] * mb:.1f} | "
              f"{total * mb:.1f} | {r['setup_rss'] * mb:.0f} | {peak * mb:.0f} | {step:.3f} |")
    ddp, fsdp = (r[1]["params"] + r[1]["grads"] + r[1]["optimizer"] for r in rows)
    print(f"\nFSDP2 / DDP state per rank: {fsdp / ddp:.3f} (1/{args.world} = {1 / args.world:.3f})")
    harness.write_results(args, per_rank=everything)
    return 0


if __name__ == "__main__":
    sys.exit(main())
