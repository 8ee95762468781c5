"""The default tracker: one JSON object per ``log`` call in ``<logging_dir>/<project_name>/metrics.jsonl``.

No dependency. Each line is flushed and fsynced as it is written, so a crash loses at most the line being
written; ``read_metrics`` skips a torn last line. The file is appended to, so a resumed run continues it.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, TextIO

from overdrive.tracking.base import GeneralTracker, to_python

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


def _default(value: Any) -> Any:
    converted = to_python(value)
    if converted is value:
        return str(value)
    return converted


def write_json_atomically(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file, so readers never see half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, default=_default, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class JSONLTracker(GeneralTracker):
    """Append ``{"step": ..., "time": ..., **values}`` to ``metrics.jsonl``; the config goes to
    ``config.json`` in the same folder. ``fsync=False`` skips the per-line fsync (faster, less safe)."""

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, fsync: bool = True) -> None:
        self.run_name = run_name
        self.run_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.path = os.path.join(self.run_dir, METRICS_FILE)
        self.fsync = fsync
        self._file: TextIO | None = None

    def start(self) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # closed in finish()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        write_json_atomically(os.path.join(self.run_dir, CONFIG_FILE), values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self._file is None:
            raise RuntimeError("JSONLTracker.log called before start(): call accelerator.init_trackers first")
        record = {"step": step, "time": time.time(), **{k: to_python(v) for k, v in values.items()}}
        self._file.write(json.dumps(record, default=_default) + "\n")
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def find_metrics_file(run_dir: str | os.PathLike) -> str:
    """``run_dir/metrics.jsonl``, or the one ``<run_dir>/<project>/metrics.jsonl``, or ``run_dir`` itself
    when it is a file; an error listing the candidates otherwise."""
    run_dir = os.fspath(run_dir)
    if os.path.isfile(run_dir):
        return run_dir
    direct = os.path.join(run_dir, METRICS_FILE)
    if os.path.isfile(direct):
        return direct
    found = sorted(os.path.join(run_dir, d, METRICS_FILE) for d in os.listdir(run_dir)
                   if os.path.isfile(os.path.join(run_dir, d, METRICS_FILE))) if os.path.isdir(run_dir) else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir!r} or its sub-folders: give the folder "
                                "init_trackers wrote to (<project_dir>/<project_name>)")
    raise ValueError(f"{run_dir!r} holds several runs, name one of: {[os.path.dirname(f) for f in found]}")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order; a torn (unterminated) last line is skipped."""
    records: list[dict[str, Any]] = []
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not a metrics file: it is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); give the {METRICS_FILE} the JSONL tracker wrote, or its folder") from None
    lines = text.split("\n")[:-1]  # what follows the last newline is a line a crash interrupted (or nothing)
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number} is not a metrics record (a JSON object), but {type(record).__name__}")
            records.append(record)
    return records


def metric_series(records: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Each numeric metric as ``(steps, values)``. A record without a step is placed at its position in
    the file; when a step repeats (a resumed run), the later value wins."""
    series: dict[str, dict[float, float]] = {}
    for position, record in enumerate(records):
        step = record.get("step")
        x = position if step is None else step
        for key, value in record.items():
            if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and math.isnan(value):
                continue
            series.setdefault(key, {})[x] = float(value)
    return {key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in series.items()}
