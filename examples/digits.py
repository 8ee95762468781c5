"""Train a small classifier on scikit-learn's handwritten digits (shipped with the package: no download).

One process:        python examples/digits.py
Two CPU processes:  overdrive launch --num_processes 2 examples/digits.py

The same script, unchanged, runs on one process or many; it prints the held-out accuracy at the end.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from overdrive import Accelerator
from overdrive.tracking.progress import progress_bar
from overdrive.utils import set_seed


def build_data(batch_size: int) -> tuple[DataLoader, DataLoader]:
    from sklearn.datasets import load_digits  # here: tests import train_step without loading scikit-learn
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True)
    test = DataLoader(TensorDataset(x_test, y_test), batch_size=128)
    return train, test


def train_step(accelerator: Accelerator, model: nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor,
               loss_fn: Callable[..., torch.Tensor] = nn.functional.cross_entropy, scheduler: Any = None) -> torch.Tensor:
    """One micro-batch of the training loop; returns its loss. Inside ``accumulate`` the gradients are
    synchronised, and the optimizer (and scheduler) step, only on the last micro-batch of each window."""
    with accelerator.accumulate(model):
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
    return loss


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--mixed-precision", default=None, choices=["no", "bf16", "fp16"])
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision,
                              gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(0)
    train_loader, test_loader = build_data(args.batch_size)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train_loader, test_loader = accelerator.prepare(model, optimizer, train_loader, test_loader)
    accelerator.print(f"training on {accelerator.num_processes} process(es), {accelerator.device}, "
                      f"mixed precision {accelerator.mixed_precision}")

    progress = progress_bar(total=args.epochs * len(train_loader), desc="train")  # main process only
    for _ in range(args.epochs):
        model.train()
        for x, y in train_loader:
            loss = train_step(accelerator, model, optimizer, x, y)
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    progress.close()

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in test_loader:
            predictions, labels = accelerator.gather_for_metrics((model(x).argmax(dim=-1), y))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
    accuracy = correct / total
    accelerator.print(f"held-out accuracy: {accuracy:.4f} on {total} samples")
    return accuracy


if __name__ == "__main__":
    main()
