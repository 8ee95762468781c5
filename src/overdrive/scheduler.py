"""The prepared LR scheduler: steps with the optimizer, as Accelerate's does."""

from __future__ import annotations

from typing import Any

from overdrive.optimizer import AcceleratedOptimizer
from overdrive.state import GradientState


class AcceleratedScheduler:
    """Wraps a user's LR scheduler so that calling ``scheduler.step()`` on every batch stays right.

    - During accumulation it does not step (with ``adjust_scheduler`` only its step counter moves, so
      torch does not warn about the order of ``optimizer.step`` and ``scheduler.step``).
    - When the optimizer skipped its step (fp16 overflow) it does not step either.
    - Without ``split_batches`` each step consumes ``num_processes`` batches of the original loader, so
      it steps ``num_processes`` times: a schedule written in single-process steps keeps its length.
    """

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer], step_with_optimizer: bool = True,
                 split_batches: bool = False, num_processes: int = 1,
                 gradient_state: GradientState | None = None) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes
        self.gradient_state = gradient_state or GradientState()
        self._window = self.gradient_state.window
        # only an optimizer with a loss scaler (or an engine's, which says so itself) can skip a step
        plain = AcceleratedOptimizer.step_was_skipped
        self._may_skip = [opt for opt in optimizers
                          if getattr(opt, "scaler", None) is not None or getattr(type(opt), "step_was_skipped", plain) is not plain]

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler only when the optimizers really stepped (not inside an
        accumulation window, not after a skipped fp16 step); once per process unless ``split_batches``, as
        Accelerate does."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        window = self._window
        if not window.sync:
            if window.adjust_scheduler and hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1
            return
        for opt in self._may_skip:  # (a loop, not any(genexpr): the hot path of every loop with a scheduler)
            if opt.step_was_skipped:
                return
        for _ in range(1 if self.split_batches else self.num_processes):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR refuses to pass its end
            if total is None or self.scheduler.last_epoch < total:
                self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The wrapped scheduler's last learning rates."""
        return self.scheduler.get_last_lr()

    def get_lr(self) -> Any:
        """The wrapped scheduler's learning rates."""
        return self.scheduler.get_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped scheduler's state."""
        self.scheduler.load_state_dict(state_dict)

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped scheduler's ``print_lr``."""
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found on the wrapper: expose the scheduler's own attributes.
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
