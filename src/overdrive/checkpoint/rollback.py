"""What ``load_state`` changes besides the model and optimizer tensors, copied so a failed load can put it
back: schedulers, registered objects, the loss scaler, counters, data-loader positions and generators,
and this process's RNG states. (The model and optimizer tensors are read in place, last, after everything
that can fail has been decoded and applied: copying them would double the memory a load needs.)
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from overdrive.checkpoint.state import capture_rng, restore_rng

if TYPE_CHECKING:
    from overdrive.training.prepared import TrainingState


def _copy(value: Any) -> Any:
    return copy.deepcopy(value)


class Snapshot:
    """The restorable state of ``pieces`` (see :class:`Pieces`), taken when built."""

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces
        self.schedulers = [_copy(s.state_dict()) for s in pieces.schedulers]
        self.custom = [_copy(o.state_dict()) for o in pieces.custom_objects]
        self.scaler = _copy(pieces.scaler.state_dict()) if pieces.scaler is not None else None
        self.counters = pieces.get_counters()
        self.loaders = [_copy(loader.state_dict()) for loader in pieces.dataloaders]
        self.generators = [g.get_state().clone() if g is not None else None
                           for g in (getattr(loader, "generator", None) for loader in pieces.dataloaders)]
        self.rng = _copy(capture_rng(pieces.device))

    def restore(self, process_state: bool = True) -> None:
        """Put back what was changed: the schedulers, registered objects and scaler, and with
        ``process_state`` the counters, data-loader positions and RNG states too (every piece is tried;
        the first failure is raised after the others were restored)."""
        p = self.pieces
        steps: list[Any] = [lambda s=s, v=v: s.load_state_dict(_copy(v)) for s, v in zip(p.schedulers, self.schedulers)]
        steps += [lambda o=o, v=v: o.load_state_dict(_copy(v)) for o, v in zip(p.custom_objects, self.custom)]
        if p.scaler is not None and self.scaler is not None:
            steps.append(lambda: p.scaler.load_state_dict(_copy(self.scaler)))
        if not process_state:
            return self._run(steps)
        steps.append(lambda: p.set_counters(self.counters))
        for loader, saved, generator in zip(p.dataloaders, self.loaders, self.generators):
            steps.append(lambda lo=loader, v=saved: lo.load_state_dict(_copy(v)))
            if generator is not None and getattr(loader, "generator", None) is not None:
                steps.append(lambda lo=loader, g=generator: lo.generator.set_state(g))
        steps.append(lambda: restore_rng(self.rng, p.device))
        self._run(steps)

    @staticmethod
    def _run(steps: list[Any]) -> None:
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - restore the rest, then report
                first = first or exc
        if first is not None:
            raise first


class Pieces:
    """The parts of a training run a load restores, from the ``TrainingState`` the Accelerator handed over."""

    def __init__(self, run: TrainingState) -> None:
        self.run = run
        self.schedulers = list(run.objects.schedulers)
        self.custom_objects = list(run.objects.custom_objects)
        self.scaler = run.scaler
        self.dataloaders = list(run.objects.dataloaders)
        self.device = run.device

    def get_counters(self) -> dict[str, Any]:
        """The run's counters as saved: the accumulation window's state and the project's ``iteration``."""
        return {**self.run.window.state_dict(), "iteration": self.run.project.iteration}

    def set_counters(self, counters: dict[str, Any]) -> None:
        """Put back counters returned by :meth:`get_counters` (through the training state)."""
        self.run.load_counters(counters)
