"""The ``Accelerator``'s experiment tracking: ``init_trackers``, ``get_tracker``, ``log``, ``end_training`` and
the running ``trackers``.

``Accelerator`` inherits them; the trackers themselves (one module each, their libraries imported when
started) are ``overdrive.tracking``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overdrive.config import ProjectConfiguration
    from overdrive.resolve import TrainingPlan
    from overdrive.training.state import AcceleratorState


class TrackingVerbs:
    """Accelerate's tracking verbs on an object with ``plan``, ``state`` and ``project_configuration``."""

    plan: TrainingPlan
    state: AcceleratorState
    project_configuration: ProjectConfiguration

    @property
    def trackers(self) -> list[Any]:
        """The running trackers: empty until ``init_trackers``."""
        return self.__dict__.setdefault("_trackers", [])

    @trackers.setter
    def trackers(self, value: list[Any]) -> None:
        self.__dict__["_trackers"] = list(value)

    def init_trackers(self, project_name: str, config: dict | None = None,
                      init_kwargs: dict[str, dict] | None = None) -> None:
        """Start the trackers named by ``log_with`` (JSONL when none is named) for ``project_name``."""
        from overdrive.tracking import start_trackers  # lazy: the tracking package loads only when a run logs

        self.trackers = start_trackers(
            self.plan.log_with, project_name, config=config, init_kwargs=init_kwargs or {},
            logging_dir=self.project_configuration.logging_dir, process_index=self.state.process_index)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The running tracker called ``name`` (its library's own object with ``unwrap=True``)."""
        from overdrive.tracking import find_tracker  # lazy: the tracking package loads only when a run logs

        return find_tracker(self.trackers, name, unwrap=unwrap)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, dict] | None = None) -> None:
        """Log ``values`` at ``step`` to every running tracker (on the processes each tracker logs from)."""
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker (flush and close its files), wait for a checkpoint still being written in the
        background (``save_state(async_save=True)``) and for all processes."""
        # lazy: the checkpoint package loads only when a run uses it
        from overdrive.checkpoint.background import wait_for_pending_save

        wait_for_pending_save()
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        self.state.wait_for_everyone()
