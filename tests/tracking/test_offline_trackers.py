"""Comet, ClearML, Trackio and SwanLab, each run offline through ``Accelerator(log_with=NAME)`` in one child
process (their libraries patch things process-wide), then read back from what each library wrote: the
logged losses at their steps, Accelerate's naming (ClearML's ``eval_acc`` -> plot ``acc``, series ``eval``)
and the stored configuration. DVCLive is not installed in the tests (it pulls DVC, ~70 packages)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.scripts.offline_trackers import offline_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent.parent / "scripts" / "offline_trackers.py"
LIBRARIES = {"comet_ml": "comet_ml", "clearml": "clearml", "trackio": "trackio", "swanlab": "swanlab"}
LOSSES = [1.5, 0.75, 0.25]
ACCS = [0.5, 1.5, 2.5]


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Path:
    names = [name for name, module in LIBRARIES.items() if importlib.util.find_spec(module) is not None]
    root = tmp_path_factory.mktemp("offline")
    env = {**os.environ, **offline_env(root)}
    # Output to a file, not a pipe: a process one of the libraries forks can outlive the script holding
    # a pipe open (reading it would then wait for that process); the leftovers of its session are ended.
    log = root / "output.txt"
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, str(SCRIPT), str(root), *names], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode = child.wait(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
    output = log.read_text()
    assert returncode == 0, output[-5000:]
    assert [line.split()[1] for line in output.splitlines() if line.startswith("LOGGED")] == names
    return root


@pytest.mark.requires("comet_ml")
def test_comet_offline_experiment(logged: Path) -> None:
    (archive,) = (logged / "comet_ml").glob("*.zip")
    messages = [json.loads(line) for line in zipfile.ZipFile(archive).read("messages.json").decode().splitlines()]
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    assert [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "loss"] == list(enumerate(LOSSES))
    assert [m["metricValue"] for m in metrics if m["metricName"] == "eval_acc"] == ACCS
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
              for m in messages if m["type"] == "parameter_msg"}
    assert params["lr"] == 0.1 and params["layers"] == 2


@pytest.mark.requires("clearml")
def test_clearml_offline_task(logged: Path) -> None:
    (session,) = [p for p in (logged / "clearml" / "offline").iterdir() if p.is_dir()]
    events = [event for line in (session / "metrics.jsonl").read_text().splitlines() for event in json.loads(line)]
    scalars = {(e["metric"], e["variant"], e["iter"]): e["value"] for e in events
               if e["type"] == "training_stats_scalar"}
    assert scalars == {**{("loss", "train", s): v for s, v in enumerate(LOSSES)},
                       **{("acc", "eval", s): v for s, v in enumerate(ACCS)}}
    task = json.loads((session / "task.json").read_text())
    assert task["name"] == "overdrive_offline"
    assert task["configuration"]["General"]["value"].splitlines() == ["lr = 0.1", "layers = 2"]


@pytest.mark.requires("trackio")
def test_trackio_local_database(logged: Path) -> None:
    with sqlite3.connect(logged / "trackio" / "overdrive_offline.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
        (config,) = db.execute("SELECT config FROM configs").fetchone()
    assert [(step, json.loads(values)) for step, values in rows] == \
        [(s, {"loss": loss, "eval_acc": acc}) for s, (loss, acc) in enumerate(zip(LOSSES, ACCS))]
    assert json.loads(config)["lr"] == 0.1


@pytest.mark.requires("swanlab")
def test_swanlab_offline_run(logged: Path) -> None:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (backup,) = (logged / "swanlab").glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(backup)
    scalars = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("scalar"):
            scalars.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
    reader.close()
    assert [(s, v) for k, s, v in scalars if k == "loss"] == list(enumerate(LOSSES))
    assert [v for k, _, v in scalars if k == "eval_acc"] == ACCS
    (config,) = (logged / "swanlab").glob("run-*/files/config.yaml")
    assert "lr:" in config.read_text() and "0.1" in config.read_text()
