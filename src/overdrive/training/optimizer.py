"""The prepared optimizer: steps once per accumulation window, through the loss scaler when there is one.

It stays a ``torch.optim.Optimizer`` (so LR schedulers and ``isinstance`` checks accept it) and
delegates its state to the user's optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from overdrive.training.state import GradientState


def move_to_device(state: Any, device: Any) -> Any:
    """``state`` (nested lists, tuples, dicts of tensors, as an optimizer's state dict) with every tensor moved
    to ``device``; containers keep their types."""
    if isinstance(state, (list, tuple)):
        moved = [move_to_device(item, device) for item in state]
        return type(state)(*moved) if hasattr(state, "_fields") else type(state)(moved)
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def patch_optimizer_step(accelerated_optimizer: Any, method: Callable) -> Callable:
    """``method`` (an optimizer's ``step``) wrapped to record on ``accelerated_optimizer`` that it ran
    (``_accelerate_step_called``), which is how a skipped step is told from a taken one."""
    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a user's optimizer.

    ``step()`` and ``zero_grad()`` act only when ``accelerator.sync_gradients`` is true, i.e. on the last
    micro-batch of an accumulation window, so the plain loop (step and zero_grad on every batch) is
    right inside ``accelerator.accumulate``. With fp16 loss scaling a step whose gradients overflowed is
    skipped by the scaler; ``step_was_skipped`` says so.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None,
                 gradient_state: GradientState | None = None) -> None:
        # No super().__init__: the param groups and state belong to the wrapped optimizer.
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = gradient_state or GradientState()
        self._window = self.gradient_state.window  # read on every step: one attribute, not a property
        # Accelerate's name: scripts and Accelerate's tests read and set it (a step without a scaler leaves it)
        self._is_overflow = False
        self._unscaled = False
        # an optimizer that may drop a step itself (fault-tolerant training's) says so after each step
        self._reports_skips = hasattr(optimizer, "step_was_skipped")

    # -- delegated state ----------------------------------------------------------------------------
    @property
    def state(self) -> Any:
        """The wrapped optimizer's state."""
        return self.optimizer.state

    # torch declares state and param_groups as attributes; the wrapper delegates them to the wrapped optimizer
    @state.setter
    def state(self, value: Any) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's defaults."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        """For optimizers with a train/eval mode (schedule-free); a no-op otherwise."""
        train = getattr(self.optimizer, "train", None)
        if train is not None:
            train()

    def eval(self) -> None:
        """Put the wrapped optimizer in evaluation mode when it has one (schedule-free optimizers)."""
        evaluate = getattr(self.optimizer, "eval", None)
        if evaluate is not None:
            evaluate()

    # -- the step -----------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._window.sync:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def unscale_(self) -> None:
        """Divide the gradients by the loss scale, once per step (clipping needs true gradients)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if not self._window.sync:
            return None
        self._unscaled = False
        if self.scaler is None:
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
            if self._reports_skips:
                self._is_overflow = bool(self.optimizer.step_was_skipped)  # pyright: ignore[reportAttributeAccessIssue]
            return result
        scale = self.scaler.get_scale()
        result = self.scaler.step(self.optimizer, closure) if closure is not None else self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it found inf/nan gradients and skipped the step.
        self._is_overflow = self.scaler.get_scale() < scale
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step()`` was skipped because fp16 gradients overflowed (or, in fault-tolerant
        training, because the step was not committed)."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
