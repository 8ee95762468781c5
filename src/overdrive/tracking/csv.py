"""A CSV tracker: ``<logging_dir>/<project_name>/metrics.csv``, one row per ``log`` call.

Columns are ``step``, ``time`` and every metric name seen so far, in first-seen order; nested dicts become
``outer/inner`` columns. When a call brings a new metric, the file is rewritten once with the wider header
(through a temporary file, so a crash never leaves half a file); earlier rows get empty cells there.
The config goes to ``config.csv`` as ``key,value`` rows.
"""

from __future__ import annotations

import csv
import os
import time
from typing import Any, TextIO

from overdrive.tracking.base import GeneralTracker, flatten

METRICS_FILE = "metrics.csv"
CONFIG_FILE = "config.csv"


class CSVTracker(GeneralTracker):
    """Write metrics as a wide CSV table (``step,time,<metric>...``) that pandas or a spreadsheet opens."""

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, fsync: bool = True) -> None:
        self.run_name = run_name
        self.run_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.path = os.path.join(self.run_dir, METRICS_FILE)
        self.fsync = fsync
        self.columns: list[str] = ["step", "time"]
        self._file: TextIO | None = None

    def start(self) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        if os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, newline="", encoding="utf-8") as handle:
                header = next(csv.reader(handle), None)
            if header:
                self.columns = header
            self._file = open(self.path, "a", newline="", encoding="utf-8")  # closed in finish()
        else:
            self._file = open(self.path, "w", newline="", encoding="utf-8")
            self._write_rows([self.columns])

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        tmp = os.path.join(self.run_dir, CONFIG_FILE + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["key", "value"])
            writer.writerows(flatten(values).items())
        os.replace(tmp, os.path.join(self.run_dir, CONFIG_FILE))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self._file is None:
            raise RuntimeError("CSVTracker.log called before start(): call accelerator.init_trackers first")
        row = {"step": "" if step is None else step, "time": time.time(), **flatten(values)}
        new = [key for key in row if key not in self.columns]
        if new:
            self._widen(self.columns + new)
        self._write_rows([[row.get(column, "") for column in self.columns]])

    def _write_rows(self, rows: list[list[Any]]) -> None:
        assert self._file is not None
        csv.writer(self._file).writerows(rows)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def _widen(self, columns: list[str]) -> None:
        assert self._file is not None
        self._file.close()
        with open(self.path, newline="", encoding="utf-8") as handle:
            old_rows = list(csv.reader(handle))[1:]
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            padding = [""] * (len(columns) - len(self.columns))
            writer.writerows(row + padding for row in old_rows)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        self.columns = columns
        self._file = open(self.path, "a", newline="", encoding="utf-8")

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
