"""Comet, ClearML, DVCLive, Trackio and SwanLab trackers (Accelerate's names), each importing its library
only in ``start()``; a missing library is an error saying what to ``pip install``.

Keyword arguments given to the tracker (``init_trackers(..., init_kwargs={"comet_ml": {...}})``) go to the
library's own start call; ``log`` keyword arguments to its logging call.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from overdrive.tracking.base import LibraryRunTracker, import_required


def _numbers(values: dict[str, Any]) -> dict[str, numbers.Number]:
    return {k: v for k, v in values.items() if isinstance(v, numbers.Number) and not isinstance(v, bool)}


class CometMLTracker(LibraryRunTracker):
    """A Comet experiment in project ``run_name`` (``comet_ml.start``; ``COMET_MODE=offline`` stays local)."""

    name = "comet_ml"
    required_packages = (("comet_ml", "comet-ml"),)

    def start(self) -> None:
        comet_ml = import_required("comet_ml", "comet-ml", self.name)
        self.run = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        # as Accelerate: numbers are metrics at ``step``, strings "others", a dict a group of metrics
        if step is not None:
            self.run.set_step(step)
        for key, value in values.items():
            if isinstance(value, dict):
                self.run.log_metrics(value, step=step, **kwargs)
            elif isinstance(value, str):
                self.run.log_other(key, value, **kwargs)
            elif isinstance(value, numbers.Number):
                self.run.log_metric(key, value, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.end()
            self.run = None


class ClearMLTracker(LibraryRunTracker):
    """A ClearML task (``Task.init``) in project and with task name ``run_name`` (the variables
    ``CLEARML_PROJECT`` / ``CLEARML_TASK`` take priority, as in Accelerate), or the task already running in this
    process (then left open at the end). Scalars go to the task's logger as Accelerate sends them: ``eval_x`` /
    ``test_x`` / ``train_x`` become series ``eval`` / ``test`` / ``train`` of plot ``x``, other names series
    ``train``; without a step, a single value. ``log_images`` and ``log_table`` report images and tables the
    same way. ``CLEARML_OFFLINE_MODE=1`` (or ``Task.set_offline(True)``) keeps everything local."""

    name = "clearml"
    required_packages = (("clearml", "clearml"),)

    def __init__(self, run_name: str | None = None, **init_kwargs: Any) -> None:
        super().__init__(run_name, **init_kwargs)  # pyright: ignore[reportArgumentType]

    def start(self) -> None:
        clearml = import_required("clearml", "clearml", self.name)
        self.external = clearml.Task.current_task() is not None
        if self.external:
            self.run = clearml.Task.current_task()
            return
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.run_name))
        kwargs.setdefault("task_name", os.environ.get("CLEARML_TASK", self.run_name))
        self.run = clearml.Task.init(**kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        logger = self.run.get_logger()
        for key, value in _numbers(values).items():  # (other values are not scalars: dropped, as Accelerate)
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = _title_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report each image (a numpy array or PIL image) under its name's plot and series, at ``step``;
        ``kwargs`` go to ``Logger.report_image``."""
        logger = self.run.get_logger()
        for key, image in values.items():
            title, series = _title_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs: Any) -> None:
        """Report a table: a ``dataframe``, or rows of ``data`` (headed by ``columns``, or by its first row
        when there are no columns); ``kwargs`` go to ``Logger.report_table``."""
        table = dataframe
        if table is None:
            if data is None:
                raise ValueError(f"ClearMLTracker.log_table({table_name!r}) needs data= (rows) or dataframe=")
            table = [columns, *data] if columns else data
        title, series = _title_series(table_name)
        self.run.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None and not getattr(self, "external", False):
            self.run.close()
        self.run = None


def _title_series(key: str) -> tuple[str, str]:
    """ClearML's (plot title, series) for a metric name, as Accelerate maps it."""
    for prefix in ("eval", "test", "train"):
        if key.startswith(prefix + "_"):
            return key[len(prefix) + 1:], prefix
    return key, "train"


class DVCLiveTracker(LibraryRunTracker):
    """A DVCLive ``Live`` run (files under its ``dir``; the logging directory when there is one)."""

    name = "dvclive"
    uses_logging_directory = True
    required_packages = (("dvclive", "dvclive"),)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = None, live: Any = None,
                 **init_kwargs: Any) -> None:
        super().__init__(run_name, **init_kwargs)
        self.live = live  # a ``Live`` the caller made (Accelerate's ``live=``): used instead of a new one
        if logging_dir is not None:
            self.init_kwargs.setdefault("dir", os.path.join(os.fspath(logging_dir), "dvclive"))

    def start(self) -> None:
        if self.live is not None:
            self.run = self.live
            return
        dvclive = import_required("dvclive", "dvclive", self.name)
        self.run = dvclive.Live(**self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.run.step = step
        for key, value in _numbers(values).items():
            self.run.log_metric(key, value, **kwargs)
        self.run.next_step()

    def finish(self) -> None:
        if self.run is not None:
            self.run.end()
            self.run = None


class TrackioTracker(LibraryRunTracker):
    """A Trackio run in project ``run_name`` (local-first; ``trackio.init``)."""

    name = "trackio"
    required_packages = (("trackio", "trackio"),)

    def start(self) -> None:
        trackio = import_required("trackio", "trackio", self.name)
        self.run = trackio.init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import trackio  # lazy: optional dependency

        trackio.config.update(values)


class SwanLabTracker(LibraryRunTracker):
    """A SwanLab run in project ``run_name`` (``swanlab.init``; ``mode="offline"`` stays local)."""

    name = "swanlab"
    required_packages = (("swanlab", "swanlab"),)

    def start(self) -> None:
        swanlab = import_required("swanlab", "swanlab", self.name)
        self.run = swanlab.init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import swanlab  # lazy: optional dependency

        swanlab.config.update(values, allow_val_change=True)
