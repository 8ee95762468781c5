"""A small character-level transformer language model, trained on the source of Python's own standard
library (ships with Python: no download), under any layout of data, FSDP2 and tensor parallelism.

One process:                 python examples/tiny_lm.py
FSDP2 over 2 processes:      overdrive launch --num_processes 2 examples/tiny_lm.py --dp-shard 2
FSDP2 x tensor parallel:     overdrive launch --num_processes 4 examples/tiny_lm.py --dp-shard 2 --tp 2

The loop is the same in every case; only the ParallelismConfig changes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import textwrap

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from overdrive import Accelerator, ParallelismConfig
from overdrive.utils import set_seed


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[:2]
        # n_heads, not -1: tensor parallel divides the heads between ranks
        q, k, v = (p(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


NORMS = {"layer": nn.LayerNorm, "rms": nn.RMSNorm}


class Block(nn.Module):
    """Pre-norm attention then MLP: GELU (``up``, ``down``), or SwiGLU (``gate``, ``up``, ``down``) when ``gated``."""

    def __init__(self, dim: int, n_heads: int, ffn: int, norm: str = "layer", bias: bool = True,
                 gated: bool = False) -> None:
        super().__init__()
        self.norm1, self.norm2 = NORMS[norm](dim), NORMS[norm](dim)
        self.attn = Attention(dim, n_heads)
        self.gate = nn.Linear(dim, ffn, bias=bias) if gated else None
        self.up, self.down = nn.Linear(dim, ffn, bias=bias), nn.Linear(ffn, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h) if self.gate is not None else F.gelu(self.up(h)))


class TinyLM(nn.Module):
    """The example's model; the switches build the GPU scripts' variants too (scripts/gpu_check.py: SwiGLU
    and explicit positions; scripts/gpu_throughput.py: RMSNorm, no biases, no learned positions).

    ``seq``: learned positions (0: none); ``ffn``: the MLP's width (default ``4 * dim``); ``norm``: "layer"
    or "rms"; ``bias``: biases in the MLP; ``gated``: a SwiGLU MLP in place of GELU.
    """

    def __init__(self, vocab: int = 128, dim: int = 64, n_heads: int = 4, layers: int = 2, seq: int = 64,
                 ffn: int | None = None, norm: str = "layer", bias: bool = True, gated: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim) if seq else None
        self.layers = nn.ModuleList(Block(dim, n_heads, ffn or 4 * dim, norm, bias, gated) for _ in range(layers))
        self.norm, self.head = NORMS[norm](dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        if self.pos is not None:  # positions given when the sequence is split (context parallel)
            x = x + self.pos(position_ids if position_ids is not None else torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def stdlib_text_dataset(seq: int) -> TensorDataset:
    """Fixed-length windows of ASCII characters from a few standard-library modules."""
    text = "".join(textwrap.dedent(inspect.getsource(m)) for m in (argparse, json, textwrap))
    ids = torch.tensor([min(ord(c), 127) for c in text], dtype=torch.long)
    windows = ids[: len(ids) // (seq + 1) * (seq + 1)].view(-1, seq + 1)
    return TensorDataset(windows[:, :-1], windows[:, 1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp-shard", type=int, default=1)
    parser.add_argument("--dp-replicate", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8, help="per data-parallel rank")
    parser.add_argument("--mixed-precision", default=None, choices=["no", "bf16", "fp16"])
    args = parser.parse_args()

    layout = ParallelismConfig(dp_replicate_size=args.dp_replicate, dp_shard_size=args.dp_shard, tp_size=args.tp)
    accelerator = Accelerator(mixed_precision=args.mixed_precision, parallelism_config=layout)
    set_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(stdlib_text_dataset(seq=64), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses, step = [], 0
    while step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
            step += 1
            if step == args.steps:
                break
    accelerator.print(f"layout dp_replicate={args.dp_replicate} dp_shard={args.dp_shard} tp={args.tp}: "
                      f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {step} steps")


if __name__ == "__main__":
    main()
