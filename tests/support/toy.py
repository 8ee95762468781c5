"""The toy regression that launched jobs train (tests/machines/scripts/job.py, tests/scripts/ray_train_job.py),
and its one-process plain-PyTorch reference that their tests compare with.

1024 seeded samples of a noisy linear target (8 features, 1 output), a seeded Linear-Tanh-Linear model and
SGD (lr 0.05); a run takes global batches of ``BATCH`` in order. The jobs import this module in their
processes: the repository root must be on their ``PYTHONPATH`` (the tests put it there).
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

BATCH = 32  # the global batch: each of N ranks takes BATCH // N


def toy_regression() -> tuple[TensorDataset, torch.nn.Module, torch.optim.Optimizer]:
    """The data, and a freshly seeded model with its optimizer (reseeds torch's global generator)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(1024, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return TensorDataset(x, y), model, torch.optim.SGD(model.parameters(), lr=0.05)


def reference_weights(steps: int, batch: int = BATCH) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``steps`` steps of the training in one process, plain PyTorch, global batches of ``batch``: the
    weights at the end, and each step's loss."""
    data, model, optimizer = toy_regression()
    x, y = data.tensors
    losses = []
    for step in range(steps):
        rows = slice(batch * step, batch * (step + 1))
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model.state_dict(), losses
