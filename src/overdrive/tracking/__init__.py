"""Experiment tracking: ``Accelerator(log_with=...)``, ``init_trackers``, ``log``, ``get_tracker``,
``end_training``.

Built-in trackers, each importing its library only when started: ``jsonl`` (the default, no dependency),
``csv``, ``tensorboard``, ``mlflow``, ``wandb``, ``aim``. Add your own by subclassing ``GeneralTracker``
and passing an instance in ``log_with`` or registering the class::

    from overdrive.tracking import GeneralTracker, register_tracker
    register_tracker("print", PrintTracker)
    accelerator = Accelerator(log_with=["print", "tensorboard"], project_dir="runs")
"""

from __future__ import annotations

from overdrive._lazy import lazy_exports
from overdrive.helpers.logging import get_logger
from overdrive.tracking.base import (
    DEFAULT_TRACKER,
    GeneralTracker,
    available_trackers,
    check_log_with,
    find_tracker,
    on_main_process,
    register_tracker,
    start_trackers,
    tracker_class,
    tracker_names,
)
from overdrive.tracking.csv import CSVTracker
from overdrive.tracking.jsonl import JSONLTracker, find_metrics_file, metric_series, read_metrics

_LAZY = {
    "TensorBoardTracker": "overdrive.tracking.tensorboard",
    "MLflowTracker": "overdrive.tracking.mlflow",
    "WandBTracker": "overdrive.tracking.wandb",
    "AimTracker": "overdrive.tracking.aim",
    **dict.fromkeys(("CometMLTracker", "ClearMLTracker", "DVCLiveTracker", "TrackioTracker", "SwanLabTracker"),
                    "overdrive.tracking.library_runs"),
    **dict.fromkeys(("LOGGER_TYPE_TO_CLASS", "filter_trackers", "get_available_trackers", "register_tracker_class"),
                    "overdrive.tracking.accelerate_names"),
}

#: Accelerate's module logger (``accelerate.tracking.logger``), process-aware
logger = get_logger("accelerate.tracking")

__all__ = [
    "DEFAULT_TRACKER", "GeneralTracker", "available_trackers", "check_log_with", "find_tracker",
    "on_main_process", "register_tracker", "start_trackers", "tracker_class", "tracker_names",
    "CSVTracker", "JSONLTracker", "find_metrics_file", "metric_series", "read_metrics", *_LAZY,
]
# the optional-library trackers import nothing heavy either, but keep `import overdrive.tracking` minimal
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
