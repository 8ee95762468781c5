"""``MLflowTracker`` has Accelerate's signature and reads the ``MLFLOW_*`` variables as Accelerate does, and a
run started with it lands where the real Accelerate's lands (experiment, run name, tags, description, nesting,
metrics); the same script under the real Accelerate and under the alias."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate", "mlflow")]


def _mlflow(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process
    whose working folder is a new temporary one."""
    import inspect
    import os

    os.environ.update(MLFLOW_TRACKING_URI=f"file:{os.path.abspath('mlruns')}", MLFLOW_ALLOW_FILE_STORE="true")
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    from unittest import mock

    import mlflow
    from accelerate.tracking import MLflowTracker
    from mlflow.tracking import MlflowClient

    out: dict = {"parameters": list(inspect.signature(MLflowTracker).parameters)[:7]}
    for value in ("False", "0", "no", "true", "1", "on"):
        with mock.patch.dict(os.environ, {"MLFLOW_NESTED_RUN": value}):
            out[f"nested_{value}"] = MLflowTracker(experiment_name="e", logging_dir="logs").nested_run
    variables = {"MLFLOW_EXPERIMENT_NAME": "from_env", "MLFLOW_TAGS": '{"team": "env"}', "MLFLOW_RUN_ID": "abc"}
    with mock.patch.dict(os.environ, variables):
        tracker = MLflowTracker(experiment_name="e", logging_dir="logs", run_id="x", tags={"team": "arg"})
    out["from_env"] = (tracker.experiment_name, tracker.tags, tracker.run_id)
    positional = MLflowTracker("exp", "logs", None, {"k": "v"}, True, "name", "text")
    out["positional"] = (positional.experiment_name, positional.logging_dir, positional.run_id, positional.tags,
                         positional.nested_run, positional.run_name, positional.description)

    with mlflow.start_run(run_name="parent") as parent:  # nested_run=True: the tracker's run is a child of it
        tracker = MLflowTracker(experiment_name="exp", logging_dir="logs", tags={"team": "t"}, nested_run=True,
                                run_name="child", description="about it")
        tracker.start()
        tracker.store_init_configuration({"lr": 0.1})
        tracker.log({"loss": 0.5, "note": "dropped"}, step=3)
        run_id = tracker.active_run.info.run_id
        tracker.finish()
    run = MlflowClient().get_run(run_id)
    experiment = MlflowClient().get_experiment(run.info.experiment_id)
    tags = run.data.tags
    out["run"] = {"experiment": experiment.name, "name": run.info.run_name, "team": tags.get("team"),
                  "description": tags.get("mlflow.note.content"),
                  "parent": tags.get("mlflow.parentRunId") == parent.info.run_id,
                  "metrics": run.data.metrics, "params": run.data.params}
    return out


def test_mlflow_tracker_matches_accelerate():
    theirs = run_function(_mlflow, "accelerate")
    ours = run_function(_mlflow, "overdrive")
    assert ours == theirs
    assert theirs["nested_False"] is False and theirs["nested_on"] is True
    assert theirs["run"]["parent"] and theirs["run"]["metrics"] == {"loss": 0.5}
