"""Cold-start compile time of a 12-block transformer: regional (each block compiled in place, one compiled
graph reused by all 12) against whole-model ``torch.compile``, and their steady-state step times.

    .venv/bin/python bench/compile_time.py               # 2 rounds: ~10-20 min on 2 busy CPU cores
    .venv/bin/python bench/compile_time.py --rounds 1 --blocks 4

Every sample is a fresh process with an empty ``TORCHINDUCTOR_CACHE_DIR`` (a true cold start: no inductor,
AOTAutograd or in-memory cache). It builds the model (12 blocks of a pre-norm transformer, d_model 128,
4 heads, feed-forward 512, sequences of 64, batch 8), compiles it (``model.compile()`` or
``block.compile()`` for each block, what ``compile_regions`` / ``use_regional_compilation=True`` do),
runs one training step (forward, backward, AdamW: the compile happens here) and then ``--steps`` more.
Reported: the first step's time (compile included), the median of the later steps, the ratios
regional/whole; targets (issue 15): cold start <= 1/3 of whole-model, steady-state step within 2%.
Writes bench/results/compile_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(blocks: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):  # a user class: dynamo compiles its frames (it skips torch.nn's own modules')
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(128), nn.LayerNorm(128)
            self.qkv, self.out = nn.Linear(128, 384), nn.Linear(128, 128)
            self.up, self.down = nn.Linear(128, 512), nn.Linear(512, 128)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, 4, 32).permute(2, 0, 3, 1, 4)
            x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 128))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.head = nn.Linear(128, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(dim=1))

    torch.manual_seed(0)
    return Model()


def child(mode: str, blocks: int, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model = build(blocks)
    if mode == "whole":
        model.compile()
    else:
        for block in model.blocks:
            block.compile()  # in place: names, state dict and checkpoints stay the model's own
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps + 1):
        x, y = torch.randn(8, 64, 128, generator=g), torch.randint(0, 10, (8,), generator=g)
        start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    from torch._dynamo.utils import counters

    print(json.dumps({"first_s": times[0], "step_s": statistics.median(times[1:]),
                      "graphs": counters["stats"].get("unique_graphs", 0)}))


def sample(mode: str, blocks: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
        result = subprocess.run([sys.executable, __file__, "--child", mode, "--blocks", str(blocks),
                                 "--steps", str(steps)], env=env, capture_output=True, text=True, timeout=3000)
    if result.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20, help="steady-state steps after the first")
    parser.add_argument("--child", choices=["whole", "regional"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.blocks, args.steps)
        return
    started, load0 = datetime.now(timezone.utc), os.getloadavg()
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    runs: dict[str, list[dict]] = {"whole": [], "regional": []}
    for index in range(args.rounds):
        for mode in (("whole", "regional") if index % 2 == 0 else ("regional", "whole")):
            runs[mode].append(sample(mode, args.blocks, args.steps))
            print(f"round {index + 1}/{args.rounds} {mode}: {runs[mode][-1]}", file=sys.stderr)
    first = {m: statistics.median(r["first_s"] for r in v) for m, v in runs.items()}
    step = {m: statistics.median(r["step_s"] for r in v) for m, v in runs.items()}
    cold, steady = first["regional"] / first["whole"], step["regional"] / step["whole"]
    print("| compile | first step, cold (s, median) | steady step (ms, median) | graphs compiled |\n|---|---|---|---|")
    for mode in ("whole", "regional"):
        print(f"| {mode} | {first[mode]:.1f} | {step[mode] * 1e3:.1f} | {runs[mode][0]['graphs']} |")
    print(f"\nregional / whole: cold start {cold:.3f} (target <= 0.333: {'met' if cold <= 1 / 3 else 'MISSED'}), "
          f"steady step {steady:.3f} (target within 2%: {'met' if abs(steady - 1) <= 0.02 else 'MISSED'}); "
          f"{args.rounds} round(s), {args.blocks} blocks")
    out = HERE / "results" / "compile_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": started.isoformat(timespec="seconds"), "commit": commit, "runs": runs,
                               "blocks": args.blocks, "load_avg_start_end": [load0, os.getloadavg()],
                               "cold_ratio": cold, "steady_ratio": steady}, indent=1))


if __name__ == "__main__":
    main()
