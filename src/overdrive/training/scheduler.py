"""The prepared LR scheduler: steps with the optimizer, as Accelerate's does."""

from __future__ import annotations

from typing import Any

from overdrive.training.optimizer import AcceleratedOptimizer
from overdrive.training.state import GradientState

_READS_FLAG = AcceleratedOptimizer.step_was_skipped  # the base property: returns ``_is_overflow``


class AcceleratedScheduler:
    """Wraps a user's LR scheduler so that calling ``scheduler.step()`` on every batch stays right.

    - During accumulation it does not step. ``GradientAccumulationPlugin(adjust_scheduler=...)`` changes
      nothing, as in Accelerate 1.15: its ``GradientState`` keeps only the plugin's non-default settings and
      reads ``adjust_scheduler`` with a False default, so the scheduler's step counter never moves there.
    - When an optimizer's step was skipped (``step_was_skipped``: fp16 overflow, or ``_is_overflow`` set by
      the script, as Accelerate reads it) it does not step either.
    - Without ``split_batches`` each step consumes ``num_processes`` batches of the original loader, so
      it steps ``num_processes`` times: a schedule written in single-process steps keeps its length. A
      ``OneCycleLR`` stops once its step counter passes ``total_steps`` (it would raise past its end).
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

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler only when the optimizers really stepped (not inside an
        accumulation window, not after a skipped fp16 step); once per process unless ``split_batches``, as
        Accelerate does."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        window = self._window
        if not window.sync:
            return
        for opt in self.optimizers:  # (a loop, not any(genexpr): the hot path of every loop with a scheduler)
            # the flag itself where step_was_skipped is the base property that returns it (no call per step)
            if opt._is_overflow if type(opt).step_was_skipped is _READS_FLAG else opt.step_was_skipped:
                return
        total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR refuses to pass its end
        for _ in range(1 if self.split_batches else self.num_processes):
            if total is None or self.scheduler._step_count <= total:
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
