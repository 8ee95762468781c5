"""Step time and per-rank memory of DeepSpeed ZeRO-2 and ZeRO-3 against DDP and FSDP2, on the same model.

    .venv/bin/python bench/zero_memory.py                      # 2 ranks, ~67M parameters, AdamW, fp32
    .venv/bin/python bench/zero_memory.py --world 2 --dim 512 --layers 2 --steps 3 --layouts ddp zero3

Each layout runs in its own group of ``--world`` processes (gloo on 127.0.0.1, one intra-op thread each)
through ``overdrive.Accelerator``: ``Accelerator()`` (DDP), ``fsdp_plugin=FullyShardedDataParallelPlugin()``
(FSDP2), ``deepspeed_plugin=DeepSpeedPlugin(zero_stage=2 | 3)``. The model is bench/fsdp_memory.py's
transformer. Reported per rank, for the rank that holds the most:

- parameter bytes: every distinct storage of the model's parameters this rank holds (a DTensor's local
  shard, a ZeRO-3 partition) and of the optimizer's own parameters (DeepSpeed's fp32 master partitions,
  which under fp32 are a second copy), counted once each;
- optimizer-state bytes: the tensors in the torch optimizer's state (exp_avg, exp_avg_sq);
- resident memory (RSS) after setup, and its peak during the steps (sampled every 2 ms), with
  ``MALLOC_MMAP_THRESHOLD_=131072`` so freed memory goes back to the system and savings show;
- the median step time after one warm-up step.

ZeRO's bucket sizes are by default those its "auto" values take for a model of hidden size ``--dim``
(``reduce_bucket_size`` = dim^2, ...): DeepSpeed's own defaults (5e8 elements) hold buffers as large as
this whole model (``--deepspeed-buckets default`` shows it).

Writes a markdown table to stdout and the numbers to bench/results/zero_memory.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import memory_harness as harness  # noqa: E402 - the harness the memory benchmarks share (fsdp_memory's model)

LAYOUTS = ("ddp", "fsdp2", "zero2", "zero3")


def _accelerator(layout: str, args: argparse.Namespace) -> Any:
    from overdrive import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin

    if layout == "fsdp2":
        return Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    if layout.startswith("zero"):
        plugin = DeepSpeedPlugin(zero_stage=int(layout[-1]), gradient_clipping=0.0)
        config = plugin.deepspeed_config
        config["train_micro_batch_size_per_gpu"] = args.batch  # no data loader is prepared here
        if args.deepspeed_buckets == "auto":  # what "auto" gives a model whose hidden size is --dim
            config["zero_optimization"].update(
                reduce_bucket_size=args.dim**2, allgather_bucket_size=args.dim**2,
                stage3_prefetch_bucket_size=int(0.9 * args.dim**2), stage3_param_persistence_threshold=10 * args.dim)
        return Accelerator(cpu=True, deepspeed_plugin=plugin)
    return Accelerator(cpu=True)


def _held_bytes(accelerator: Any, model: Any, optimizer: Any) -> dict[str, int]:
    import torch

    basic = getattr(model, "basic_optimizer", None) or optimizer.optimizer  # DeepSpeed's, or the torch one
    storages: dict[int, int] = {}
    tensors = [getattr(p, "ds_tensor", p) for p in accelerator.unwrap_model(model).parameters()]
    tensors += [p for group in basic.param_groups for p in group["params"]]
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    state = 0
    for values in basic.state.values():
        for value in values.values():
            if isinstance(value, torch.Tensor) and value.ndim > 0:
                local = value.to_local() if hasattr(value, "to_local") else value  # FSDP2: this rank's shard
                state += local.numel() * local.element_size()
    return {"params": sum(storages.values()), "optimizer": state}


def _worker(rank: int, world: int, port: int, layout: str, args: argparse.Namespace, queue: Any) -> None:
    harness.join_group(rank, world, port, DS_LOG_LEVEL="error")
    accelerator = _accelerator(layout, args)
    model, optimizer, num_params = harness.prepare_transformer(accelerator, args)
    measured = harness.measured_steps(accelerator, model, optimizer, args, rank)
    queue.put((rank, {**_held_bytes(accelerator, model, optimizer), "num_params": num_params, **measured}))
    harness.leave_group(accelerator)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_model_arguments(parser)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--deepspeed-buckets", choices=("auto", "default"), default="auto",
                        help="ZeRO bucket sizes: from the hidden size, as \"auto\" fills them (default), or "
                             "DeepSpeed's defaults (5e8 elements)")
    harness.add_output_arguments(parser, "zero_memory")
    args = parser.parse_args(argv)

    mb = 1 / 2**20
    everything = {layout: harness.run_layout(_worker, layout, args) for layout in args.layouts}
    first = next(iter(everything.values()))[0]
    print(f"{first['num_params'] / 1e6:.1f}M parameters, AdamW, fp32, {args.world} ranks, batch {args.batch}x{args.seq} "
          f"per rank, ZeRO buckets: {args.deepspeed_buckets}, MALLOC_MMAP_THRESHOLD_={harness.MMAP_THRESHOLD}\n")
    print("| layout | params MB | optimizer state MB | RSS after setup MB | peak RSS in steps MB | step s |")
    print("|---|---|---|---|---|---|")
    for layout, per_rank in everything.items():
        worst = max(per_rank, key=lambda r: r["params"] + r["optimizer"])
        print(f"| {layout} | {worst['params'] * mb:.1f} | {worst['optimizer'] * mb:.1f} | "
              f"{max(r['setup_rss'] for r in per_rank) * mb:.0f} | {max(r['peak_rss'] for r in per_rank) * mb:.0f} | "
              f"{statistics.median(r['step_s'] for r in per_rank):.3f} |")
    harness.write_results(args, per_rank=everything)
    return 0


if __name__ == "__main__":
    sys.exit(main())
