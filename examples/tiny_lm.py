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


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, dim: int = 64, n_heads: int = 4, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
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
