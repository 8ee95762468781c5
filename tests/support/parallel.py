"""Shared pieces of the parallelism tests: a small transformer with q/k/v/o attention and a gated MLP,
token data, a plain one-process reference loop, and the same loop through the Accelerator.

Holds no tests itself; the functions are importable by spawned ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 8


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # uses n_heads (divided per rank under tensor parallel), not -1
        q, k, v = (proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM, n_heads: int = HEADS, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(64, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        x = self.embed(ids) + self.pos(position_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_model(seed: int = 0, **kwargs: Any) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(**kwargs)


def make_data(n: int = 160, seq: int = SEQ, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, seq + 1), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def reference_losses(global_batch: int, steps: int, clip: float | None = None, lr: float = 1e-2,
                     dtype: torch.dtype | None = None, model: nn.Module | None = None) -> list[float]:
    """Plain PyTorch, one process, batch ``global_batch``: the loss of each step (``model`` trains)."""
    model = model if model is not None else make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loader = DataLoader(make_data(), batch_size=global_batch)
    losses = []
    for step, (ids, labels) in enumerate(loader):
        if step == steps:
            break
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(ids), labels)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def accelerated_losses(accelerator: Any, batch_size: int, steps: int, clip: float | None = None,
                       lr: float = 1e-2, model: nn.Module | None = None,
                       compute_loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                       ) -> dict[str, Any]:
    """The same loop through ``accelerator``; ``batch_size`` per data-parallel rank. Returns the global
    loss of each optimizer step (averaged over data-parallel ranks with ``gather``) and the clip norms.
    ``compute_loss(model, ids, labels)``: the loss of a batch (default: ``loss_fn`` of the logits)."""
    compute_loss = compute_loss or (lambda model, ids, labels: loss_fn(model(ids), labels))
    model = model if model is not None else make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loader = DataLoader(make_data(), batch_size=batch_size)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses, norms, window = [], [], []
    for ids, labels in loader:
        with accelerator.accumulate(model):
            loss = compute_loss(model, ids, labels)
            accelerator.backward(loss)
            window.append(accelerator.gather(loss.detach()).mean().item())
            if accelerator.sync_gradients:
                if clip is not None:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
                losses.append(sum(window) / len(window))
                window = []
            opt.step()
            opt.zero_grad()
        if len(losses) == steps:
            break
    return {"losses": losses, "norms": norms, "model": model, "optimizer": opt}


def worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))
