"""MLflow (needs ``mlflow`` or ``mlflow-skinny``).

Where runs go, first match wins: ``init_kwargs={"mlflow": {"tracking_uri": ...}}``; a tracking URI the
user already configured (``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``); else a local store under
the logging directory: ``sqlite:///<logging_dir>/mlflow.db`` when SQLAlchemy is installed (MLflow's
recommended backend), otherwise the file store ``file:<logging_dir>/mlruns``. Read either back with
``mlflow.MlflowClient(tracking_uri=tracker.tracking_uri)`` or ``mlflow ui --backend-store-uri <uri>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from overdrive.helpers.environment import str_to_bool
from overdrive.tracking.base import (
    GeneralTracker,
    flatten,
    import_required,
    is_number,
    is_package_available,
    to_python,
    warn_skipped,
)

_PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
_METRICS_PER_BATCH = 1000
_URIS_WE_SET: set[str] = set()  # so a second run in this process does not take ours for the user's


def default_tracking_uri(logging_dir: str) -> str:
    """The local store ``MLflowTracker`` uses under ``logging_dir`` when no tracking URI is configured."""
    root = os.path.abspath(logging_dir)
    if is_package_available("sqlalchemy") and is_package_available("alembic"):
        return f"sqlite:///{os.path.join(root, 'mlflow.db')}"
    return f"file:{os.path.join(root, 'mlruns')}"


class MLflowTracker(GeneralTracker):
    """One MLflow run in the experiment ``experiment_name`` (the project name when ``init_trackers`` builds it),
    with Accelerate's signature. As in Accelerate, the variables ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``,
    ``MLFLOW_TAGS`` (a JSON object) and ``MLFLOW_NESTED_RUN`` take priority over the arguments; ``run_id``
    resumes that run, ``nested_run`` nests the run in the active one, ``run_name`` / ``description`` / ``tags``
    describe it. Numbers are logged as metrics, the config as params (nested keys joined with ``/``). Keywords
    overdrive adds: ``tracking_uri`` (where runs go, see the module), and others for ``mlflow.start_run``::

        tracker = MLflowTracker(experiment_name="exp", logging_dir="runs", run_name="baseline")
        accelerator = Accelerator(log_with=tracker)
    """

    name = "mlflow"
    requires_logging_directory = False  # not when a tracking URI is configured; checked in __init__
    uses_logging_directory = True
    required_packages = (("mlflow", "mlflow"),)

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike | None = None,
                 run_id: str | None = None, tags: dict[str, Any] | str | None = None,
                 nested_run: bool | str | None = False, run_name: str | None = None, description: str | None = None,
                 *, tracking_uri: str | None = None, **start_run_kwargs: Any) -> None:
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        nested_run = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.experiment_name = experiment_name
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags: dict[str, Any] | None = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = bool(str_to_bool(nested_run)) if isinstance(nested_run, str) else nested_run
        self.run_name = run_name
        self.description = description
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.tracking_uri = tracking_uri
        self.start_run_kwargs = start_run_kwargs
        self.active_run: Any = None
        # checked here, on every process, so that every process fails alike
        if tracking_uri is None and self.logging_dir is None and not _user_set_tracking_uri():
            raise ValueError("the 'mlflow' tracker needs a place for its runs: pass Accelerator(project_dir=...), "
                             "or init_kwargs={'mlflow': {'tracking_uri': ...}}, or set MLFLOW_TRACKING_URI")

    @property
    def tracker(self) -> Any:
        return self.active_run

    def start(self) -> None:
        mlflow = import_required("mlflow", "mlflow", self.name)
        if self.tracking_uri is None and not _user_set_tracking_uri() and self.logging_dir is not None:
            self.tracking_uri = default_tracking_uri(self.logging_dir)
        if self.tracking_uri is not None:
            if self.tracking_uri.startswith("file:"):
                # MLflow >= 3.7 refuses its file store unless this is set; we asked for it explicitly
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri(self.tracking_uri)
            _URIS_WE_SET.add(mlflow.get_tracking_uri())
        else:
            self.tracking_uri = mlflow.get_tracking_uri()
        experiment_id = None
        if self.experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            experiment_id = experiment.experiment_id if experiment is not None else mlflow.create_experiment(
                self.experiment_name, tags=self.tags)
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=bool(self.nested_run), tags=self.tags,
                                           description=self.description, **self.start_run_kwargs)
        # log to this run by id, so runs the user starts meanwhile (nested or not) do not catch our values
        from mlflow.tracking import MlflowClient  # lazy: optional dependency

        self._client = MlflowClient(self.tracking_uri)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from mlflow.entities import Param  # lazy: optional dependency
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH  # lazy: optional dependency

        params = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten(values).items()]
        for start in range(0, len(params), _PARAMS_PER_BATCH):
            self._client.log_batch(self.active_run.info.run_id, params=params[start:start + _PARAMS_PER_BATCH])

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        from mlflow.entities import Metric  # lazy: optional dependency

        now_ms = int(time.time() * 1000)
        metrics = []
        for key, value in flatten(values).items():
            value = to_python(value)
            if is_number(value):
                metrics.append(Metric(key, float(value), now_ms, step or 0))
            else:
                warn_skipped(self.name, key, value, "numbers")
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self._client.log_batch(self.active_run.info.run_id, metrics=metrics[start:start + _METRICS_PER_BATCH])

    def finish(self) -> None:
        import mlflow  # lazy: optional dependency

        if self.active_run is not None:
            active = mlflow.active_run()
            if active is not None and active.info.run_id == self.active_run.info.run_id:
                mlflow.end_run()
            else:  # the user ended it, or made another run active: leave theirs alone
                self._client.set_terminated(self.active_run.info.run_id)
            self.active_run = None


def _user_set_tracking_uri() -> bool:
    """Whether the user chose a tracking URI (the variable, or ``mlflow.set_tracking_uri`` in this process),
    without importing MLflow when the script has not."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return True
    if sys.modules.get("mlflow") is None:
        return False
    try:
        # lazy: optional dependency
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:  # moved in some MLflow version: rely on the variable alone
        return False
    import mlflow  # lazy: optional dependency

    return bool(is_tracking_uri_set()) and mlflow.get_tracking_uri() not in _URIS_WE_SET
