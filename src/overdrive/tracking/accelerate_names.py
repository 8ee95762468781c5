"""Accelerate's tracking-module helpers (``LOGGER_TYPE_TO_CLASS``, ``get_available_trackers``,
``filter_trackers``, ``register_tracker_class``) over overdrive's tracker registry."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from overdrive.tracking.base import (
    GeneralTracker,
    available_trackers,
    check_log_with,
    register_tracker,
    tracker_class,
    tracker_names,
)


class _TrackerClasses(Mapping[str, type]):
    """name -> tracker class, read from the registry when asked (classes import lazily)."""

    def __getitem__(self, name: str) -> type:
        if name not in tracker_names():
            raise KeyError(name)
        return tracker_class(name)

    def __iter__(self) -> Any:
        return iter(tracker_names())

    def __len__(self) -> int:
        return len(tracker_names())


LOGGER_TYPE_TO_CLASS: Mapping[str, type] = _TrackerClasses()


def get_available_trackers() -> list[str]:
    """The trackers whose libraries are installed."""
    return available_trackers()


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` start ``tracker_class`` (Accelerate's spelling of ``register_tracker``)."""
    if not getattr(tracker_class, "name", ""):
        raise ValueError(f"{tracker_class!r} needs a non-empty class attribute 'name' to be registered")
    register_tracker(tracker_class.name, tracker_class)


def filter_trackers(log_with: list[Any], logging_dir: str | os.PathLike | None = None) -> list[Any]:
    """``log_with`` checked (unknown names and missing libraries raise, listing every problem) and without
    repeats; ``"all"`` expands to the installed trackers."""
    problems = check_log_with(log_with)
    if problems:
        raise ValueError("invalid log_with:\n  - " + "\n  - ".join(problems))
    chosen: list[Any] = []
    for entry in log_with:
        name = getattr(entry, "value", entry)
        names = available_trackers() if name == "all" else [name]
        chosen += [n for n in names if n not in chosen]
    return chosen
