"""The objects a DeepSpeed run hands around: placeholders for an optimizer and scheduler that the DeepSpeed
config defines (``DummyOptim``, ``DummyScheduler``, Accelerate's names) and what ``prepare()`` returns in
place of the user's optimizer and scheduler.

Under DeepSpeed the engine steps the optimizer and the scheduler itself: ``accelerator.backward(loss)``
runs ``engine.backward(loss)`` and, on the last micro-batch of an accumulation window, ``engine.step()``
(which clips, steps the optimizer and the scheduler, and zeroes the gradients). So the returned optimizer's
``step()`` / ``zero_grad()`` and the scheduler's ``step()`` do nothing, and a plain training loop
(``backward``, ``optimizer.step()``, ``scheduler.step()``, ``optimizer.zero_grad()``) steps exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from overdrive.training.optimizer import AcceleratedOptimizer


class DummyOptim:
    """Stands for the optimizer that the DeepSpeed config's ``optimizer`` block defines; its ``lr``,
    ``weight_decay`` and keyword arguments fill that block's ``"auto"`` values::

        optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.01)
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs

    def values(self) -> dict[str, Any]:
        """What fills the config's ``optimizer`` block: ``lr``, ``weight_decay`` and the keyword arguments."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, **self.kwargs}


class DummyScheduler:
    """Stands for the scheduler that the DeepSpeed config's ``scheduler`` block defines (its ``"auto"``
    values come from here and from the optimizer's learning rate), or builds one with
    ``lr_scheduler_callable(optimizer)`` once DeepSpeed has built the optimizer::

        scheduler = DummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer DeepSpeed built or wrapped, as ``prepare()`` returns it (the prepared optimizer itself:
    it is not wrapped again). ``step`` and ``zero_grad`` do nothing: the engine's step (run by
    ``accelerator.backward``) does both. Its param groups and state are DeepSpeed's."""

    def __init__(self, optimizer: Any, gradient_state: Any = None) -> None:
        super().__init__(optimizer, scaler=None, gradient_state=gradient_state)  # DeepSpeed scales fp16 itself

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.optimizer, "defaults", {})

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def step(self, closure: Callable[[], float] | None = None) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def unscale_(self) -> None:
        return None  # DeepSpeed unscales inside its step

    @property
    def step_was_skipped(self) -> bool:
        """Whether DeepSpeed skipped the last step because fp16 gradients overflowed."""
        return bool(getattr(self.optimizer, "overflow", False))

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({type(self.optimizer).__name__})"


class DeepSpeedSchedulerWrapper(torch.optim.lr_scheduler.LRScheduler):
    """The scheduler the engine steps. ``step`` does nothing (the engine steps it after each optimizer step,
    and not after a skipped one); the rest is the scheduler's own."""

    def __init__(self, scheduler: Any, optimizer: DeepSpeedOptimizerWrapper) -> None:  # no super().__init__
        self.scheduler = scheduler
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_last_lr(self) -> list[float | torch.Tensor]:
        if hasattr(self.scheduler, "get_last_lr"):
            return list(self.scheduler.get_last_lr())
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "optimizer"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"DeepSpeedSchedulerWrapper({type(self.scheduler).__name__})"


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The DeepSpeed plugin that the next ``prepare()`` uses (``select_deepspeed_plugin`` chooses it)."""
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError("DeepSpeed is not in use: give Accelerator(deepspeed_plugin=...) or launch with "
                         "--use_deepspeed")
    return plugin
