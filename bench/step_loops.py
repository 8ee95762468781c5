"""The workloads and the Accelerate-style loop that bench/step_overhead.py and bench/step_calls.py share.

Imports only torch's nn and data modules: step_calls.py counts the calls of a plain loop, and a loaded
``torch.distributed`` alone adds calls to every DataLoader epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

LR = 1e-3


class TinyTransformer(nn.Module):
    """2 encoder layers, d_model 128, 4 heads, feed-forward 512, over sequences of 64 vectors."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def fresh_model(workload: str) -> nn.Module:
    torch.manual_seed(0)  # every contender, on every rank, starts from the same weights
    if workload == "mlp":
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return TinyTransformer()


def make_data(workload: str, num_samples: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    shape = (num_samples, 32) if workload == "mlp" else (num_samples, 64, 128)
    return TensorDataset(torch.randn(shape, generator=gen), torch.randint(0, 10, (num_samples,), generator=gen))


def warmup(step: int) -> float:
    """The LambdaLR factor of the loops with a scheduler: linear warm-up over 10 steps."""
    return min(1.0, (step + 1) / 10)


def build_accelerator_loop(accelerator, workload, data, batch, micro_batches=False, scheduler=False):
    """The loop as an Accelerate user writes it, for ``accelerator`` (overdrive's or Accelerate's).

    Returns ``(run_epoch, model)``; with ``micro_batches=True`` the first is instead a generator function
    that runs one epoch and yields after each micro-batch (step_calls.py interleaves two loops with it).
    ``scheduler=True`` adds a prepared ``LambdaLR`` stepped after every micro-batch (it steps only when the
    optimizer did, as in Accelerate)."""
    model = fresh_model(workload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if scheduler:
        lr_scheduler = accelerator.prepare(torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, warmup))
        return _with_scheduler(accelerator, prepared, optimizer, loader, lr_scheduler), model

    def run_epoch():
        steps = 0
        for x, y in loader:
            with accelerator.accumulate(prepared):
                loss = F.cross_entropy(prepared(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            steps += 1
        return steps, x.shape[0]  # not len(x): Tensor.__len__ is a Python call, which step_calls.py counts

    # The same loop again rather than run_epoch consuming this generator: step_overhead.py times run_epoch
    # against plain for-loops, which a generator resume per step would tilt.
    def each_micro_batch():
        for x, y in loader:
            with accelerator.accumulate(prepared):
                loss = F.cross_entropy(prepared(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            yield x.shape[0]

    return (each_micro_batch if micro_batches else run_epoch), model


def _with_scheduler(accelerator, prepared, optimizer, loader, lr_scheduler):
    def each_micro_batch():
        for x, y in loader:
            with accelerator.accumulate(prepared):
                loss = F.cross_entropy(prepared(x), y)
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            yield x.shape[0]

    return each_micro_batch
