"""The few ``accelerate.test_utils`` names user test scripts import: the regression toy and two markers."""

from __future__ import annotations

import os
import unittest
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


class RegressionDataset:
    """``y = a * x + b + noise`` samples as dicts ``{"x": float32, "y": float32}`` (a seeded numpy draw)."""

    def __init__(self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(nn.Module):
    """``a * x + b`` with scalar parameters ``a`` and ``b``."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if x is None:  # Accelerate's signature has the default; the model needs an input all the same
            raise TypeError("RegressionModel.forward needs an input tensor x")
        return x * self.a + self.b


def require_cpu(test_case: Callable) -> Callable:
    """Skip the test when an accelerator device is present (it is meant for CPU-only machines)."""
    return unittest.skipUnless(not torch.accelerator.is_available(), "test requires only a CPU")(test_case)


def slow(test_case: Callable) -> Callable:
    """Skip the test unless RUN_SLOW is set to a true value."""
    run = os.environ.get("RUN_SLOW", "no").lower() in ("1", "y", "yes", "true", "on")
    return unittest.skipUnless(run, "test is slow (set RUN_SLOW=1)")(test_case)
