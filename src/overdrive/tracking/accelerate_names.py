"""Accelerate's tracking-module helpers (``LOGGER_TYPE_TO_CLASS``, ``get_available_trackers``,
``filter_trackers``, ``register_tracker_class``) over overdrive's tracker registry."""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping
from typing import Any

from overdrive.tracking.base import (
    GeneralTracker,
    available_trackers,
    check_log_with,
    register_tracker,
    tracker_class,
    tracker_names,
    unregister_tracker,
)


class _TrackerClasses(MutableMapping[str, type]):
    """name -> tracker class over the registry (the classes import when read): Accelerate's dict, which
    code reads, copies, updates and clears; setting a name registers the class."""

    def __getitem__(self, name: str) -> type:
        if name not in tracker_names():
            raise KeyError(name)
        return tracker_class(name)

    def __setitem__(self, name: str, cls: type) -> None:
        register_tracker(name, cls)

    def __delitem__(self, name: str) -> None:
        unregister_tracker(name)

    def __iter__(self) -> Any:
        return iter(tracker_names())

    def __len__(self) -> int:
        return len(tracker_names())

    def __repr__(self) -> str:
        return f"LOGGER_TYPE_TO_CLASS({tracker_names()})"


LOGGER_TYPE_TO_CLASS: MutableMapping[str, type] = _TrackerClasses()


def get_available_trackers() -> list[str]:
    """The trackers whose libraries are installed."""
    return available_trackers()


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` start ``tracker_class`` (Accelerate's spelling of
    ``register_tracker``). The class must subclass ``GeneralTracker`` and set a non-empty ``name`` and its own
    ``requires_logging_directory``; registering a taken name replaces that tracker, with a warning."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class needs a subclass of GeneralTracker, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not name or not isinstance(name, str):
        raise ValueError(f"{tracker_class.__name__} needs a non-empty class attribute 'name' (the log_with name) "
                         "to be registered")
    if not any("requires_logging_directory" in vars(k) for k in tracker_class.__mro__ if k is not GeneralTracker):
        raise ValueError(f"{tracker_class.__name__} needs the class attribute 'requires_logging_directory': True "
                         "when it writes to the logging directory (then built as cls(project_name, logging_dir, "
                         "**init_kwargs)), else False")
    if name in tracker_names():
        warnings.warn(f"register_tracker_class: a tracker named {name!r} is registered already; {tracker_class!r} "
                      "replaces it (a built-in tracker of that name is no longer reachable)", stacklevel=2)
    register_tracker(name, tracker_class)


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
