"""Local SGD: train without synchronising gradients and average the parameters every few steps."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class LocalSGD:
    """Each process takes ``local_sgd_steps`` optimizer steps on its own, then the parameters are
    averaged across processes: fewer, larger communications than DDP's per-step all-reduce::

        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
            for batch in loader:
                ...
                optimizer.step()
                local_sgd.step()
    """

    def __init__(self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps={local_sgd_steps!r} is not valid; it must be an integer >= 1")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.enabled:
            # Leave every process with the same model, whatever step the loop ended on.
            self._sync_and_avg_model_params()
            self._no_sync.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps`` steps."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    @torch.no_grad()
    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        for param in self.accelerator.unwrap_model(self.model).parameters():
            dist.all_reduce(param.data, op=dist.ReduceOp.SUM)
            param.data.div_(self.accelerator.num_processes)
