"""Experiment tracking: trackers on 2 real processes read back from disk with their own libraries, plus
unit tests of the registry, errors, rank gating, the JSONL/CSV files and ``overdrive plot``."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import sys

import pytest

from overdrive.tracking import (
    GeneralTracker,
    available_trackers,
    find_tracker,
    read_metrics,
    register_tracker,
    start_trackers,
    tracker_names,
)
from overdrive.tracking.base import is_package_available
from tests.scripts.offline_trackers import offline_env
from tests.support.distributed import run_distributed

LOSSES = [2.0, 1.5, 1.25, 0.75]
LRS = [1e-3, 8e-4, 6e-4, 4e-4]
CONFIG = {"lr": 1e-3, "batch_size": 8, "model": {"depth": 2, "act": "gelu"}}

OPTIONAL = [name for name, module in (("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("wandb", "wandb"),
                                      ("aim", "aim")) if is_package_available(module)]
# trackers whose libraries run only offline here: "all" starts them too (as Accelerate's does), so the test
# points each at a folder (tests/scripts/offline_trackers.py holds their offline switches)
OFFLINE_ONLY = [name for name in ("clearml", "comet_ml", "swanlab", "trackio") if is_package_available(name)]
QUIET_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
             "GIT_PYTHON_REFRESH": "quiet"}
INIT_KWARGS = {"wandb": {"mode": "offline"}, "aim": {"system_tracking_interval": None,
                                                     "log_system_params": False}}


def values_at(step: int, rank: int) -> dict:
    """What each rank logs at ``step``: rank 1's values differ, so a write from it would show."""
    return {"loss": LOSSES[step] + 100 * rank, "lr": LRS[step], "rank": rank}


# -- custom trackers (module level so that spawned processes can import them) -----------------------------

class FileTracker(GeneralTracker):
    """A registered, main-process-only custom tracker writing JSON lines to ``<dir>/<run>.custom``."""

    name = "filetracker"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, suffix: str = ".custom") -> None:
        self.path = os.path.join(logging_dir, run_name + suffix)
        self.lines: list[dict] = []

    def start(self) -> None:
        self.lines.append({"event": "start"})

    def store_init_configuration(self, values: dict) -> None:
        self.lines.append({"event": "config", **values})

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.lines.append({"event": "log", "step": step, **values, **kwargs})

    def finish(self) -> None:
        self.lines.append({"event": "finish"})
        with open(self.path, "w") as handle:
            handle.write("\n".join(json.dumps(line) for line in self.lines))


class PerRankTracker(GeneralTracker):
    """A custom tracker passed as an instance that logs on every process (``main_process_only = False``)."""

    name = "per_rank"
    main_process_only = False

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.records: list[dict] = []

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.records.append({"step": step, **values})

    def finish(self) -> None:
        import torch.distributed as dist

        with open(os.path.join(self.folder, f"rank_{dist.get_rank()}.json"), "w") as handle:
            json.dump(self.records, handle)


# -- what runs on each process ----------------------------------------------------------------------------

def _log_run(project_dir: str, log_with: list, init_kwargs: dict) -> dict:
    import torch.distributed as dist

    from overdrive import Accelerator

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    register_tracker("filetracker", FileTracker)
    if "per_rank" in log_with:
        log_with = [PerRankTracker(project_dir) if e == "per_rank" else e for e in log_with]
    accelerator = Accelerator(log_with=log_with, project_dir=project_dir)
    accelerator.init_trackers("proj", config=CONFIG, init_kwargs=init_kwargs)
    names = [t.name for t in accelerator.trackers]
    for step in range(len(LOSSES)):
        accelerator.log(values_at(step, accelerator.process_index), step=step,
                        log_kwargs={"filetracker": {"extra": step * 10}})
    checks: dict = {"names": names, "rank": rank}
    # get_tracker: the wrapper everywhere; the backend's object on process 0, a no-op stand-in elsewhere
    checks["jsonl_is_wrapper"] = type(accelerator.get_tracker("jsonl")).__name__
    if "tensorboard" in names:
        writer = accelerator.get_tracker("tensorboard", unwrap=True)
        checks["tb_unwrapped"] = type(writer).__name__
        writer.add_scalar("direct", 7.0, global_step=0)  # a no-op on process 1
    if "mlflow" in names:
        checks["mlflow_uri"] = accelerator.get_tracker("mlflow").tracking_uri
    try:
        accelerator.get_tracker("comet_ml")
    except ValueError as exc:
        checks["missing_error"] = str(exc)
    accelerator.end_training()
    checks["after_end"] = len(accelerator.trackers)
    return checks


def _all_and_default(all_dir: str, default_dir: str) -> dict:
    from overdrive import Accelerator
    from tests.scripts.offline_trackers import init_kwargs as offline_kwargs

    accelerator = Accelerator(log_with="all", project_dir=all_dir)
    kwargs = {**INIT_KWARGS, **{name: offline_kwargs(name, os.path.join(all_dir, name)) for name in OFFLINE_ONLY}}
    accelerator.init_trackers("proj", config=CONFIG, init_kwargs=kwargs)
    for step in range(len(LOSSES)):
        accelerator.log(values_at(step, accelerator.process_index), step=step)
    names = [t.name for t in accelerator.trackers]
    accelerator.end_training()

    accelerator = Accelerator(project_dir=default_dir)  # no log_with: the JSONL tracker
    accelerator.init_trackers("proj", config=CONFIG)
    default_names = [t.name for t in accelerator.trackers]
    for step in range(len(LOSSES)):
        accelerator.log(values_at(step, accelerator.process_index), step=step)
    accelerator.end_training()
    return {"all": names, "default": default_names}


# -- readers: each backend's files through its own library -------------------------------------------------

def read_tensorboard(log_dir: str) -> tuple[dict[str, list[tuple[int, float]]], bytes]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    hparams = b"".join(acc.PluginTagToContent("hparams").values())
    return scalars, hparams


def read_mlflow(uri: str, experiment: str) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    from mlflow.tracking import MlflowClient

    from overdrive.utils import patch_environment

    # Without SQLAlchemy the tracker writes MLflow's file store, which MLflow reads only when allowed.
    with patch_environment(MLFLOW_ALLOW_FILE_STORE="true"):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        (run,) = client.search_runs([exp.experiment_id])
        metrics = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
                   for key in run.data.metrics}
        return metrics, run.data.params


def read_wandb(wandb_root: str) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    """Parse the offline run's ``.wandb`` file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(wandb_root, "wandb", "offline-run-*", "run-*.wandb"))
    raw = open(path, "rb").read()
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = data if kind in (1, 2) else pending + data
        if kind in (1, 4):
            records.append(pending)
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict = {}
    for data in records:
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    history.setdefault(key, []).append((rec.history.step.num, json.loads(item.value_json)))
        elif kind in ("run", "config"):
            items = rec.run.config.update if kind == "run" else rec.config.update
            for item in items:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    config[key] = json.loads(item.value_json)
    return history, config


def read_aim(repo_dir: str) -> tuple[dict[str, list[tuple[int, float]]], dict, str]:
    from aim import Repo, Run
    from aim.sdk.index_manager import RepoIndexManager

    repo = Repo.from_path(repo_dir)
    (run_hash,) = repo.list_all_runs()
    RepoIndexManager.get_index_manager(repo).index(run_hash)  # finished runs are read through the index
    run = Run(run_hash, repo=Repo.from_path(repo_dir), read_only=True)
    metrics = {m.name: [(step, value[0]) for step, value in m.data.items()]
               for m in run.metrics() if not m.name.startswith("__system__")}
    return metrics, run["hparams"], run.experiment


def expected(key: str) -> list[tuple[int, float]]:
    return [(step, values_at(step, 0)[key]) for step in range(len(LOSSES))]


def assert_series(series: dict, where: str) -> None:
    for key in ("loss", "lr", "rank"):
        got = [(int(s), pytest.approx(float(v), rel=1e-6)) for s, v in series[key]]
        assert got == expected(key), f"{where}: {key} read back as {series[key]}"


def check_jsonl(run_dir: str) -> None:
    records = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # one line per log call: process 1 wrote nothing
    assert [r["loss"] for r in records] == LOSSES and [r["rank"] for r in records] == [0, 0, 0, 0]
    assert all(isinstance(r["time"], float) for r in records)
    assert records[0]["time"] <= records[-1]["time"]
    with open(os.path.join(run_dir, "config.json")) as handle:
        assert json.load(handle) == CONFIG


def check_csv(run_dir: str) -> None:
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["step", "time", "loss", "lr", "rank"]
    assert [(int(r["step"]), float(r["loss"]), float(r["lr"]), int(r["rank"])) for r in rows] == \
        [(s, LOSSES[s], LRS[s], 0) for s in range(4)]
    with open(os.path.join(run_dir, "config.csv"), newline="") as handle:
        assert dict(csv.reader(handle)) == {"key": "value", "lr": "0.001", "batch_size": "8",
                                            "model/depth": "2", "model/act": "gelu"}


def check_optional(project_dir: str, names: list[str], checks: dict | None = None) -> None:
    if "tensorboard" in names:
        scalars, hparams = read_tensorboard(os.path.join(project_dir, "proj"))
        assert_series(scalars, "tensorboard")
        if checks is not None:
            assert scalars["direct"] == [(0, 7.0)]  # through the unwrapped SummaryWriter, once
        assert b"batch_size" in hparams and b"model/depth" in hparams
    if "mlflow" in names:
        uri = (checks or {}).get("mlflow_uri") or (
            f"sqlite:///{os.path.join(project_dir, 'mlflow.db')}"
            if os.path.exists(os.path.join(project_dir, "mlflow.db"))
            else f"file:{os.path.join(project_dir, 'mlruns')}")
        assert project_dir in uri  # a local store under the logging directory
        metrics, params = read_mlflow(uri, "proj")
        assert_series(metrics, "mlflow")
        assert params == {"lr": "0.001", "batch_size": "8", "model/depth": "2", "model/act": "gelu"}
    if "wandb" in names:
        history, config = read_wandb(project_dir)
        assert_series(history, "wandb")
        assert config == CONFIG
    if "aim" in names:
        metrics, hparams, experiment = read_aim(project_dir)
        assert_series(metrics, "aim")
        assert hparams == CONFIG and experiment == "proj"


# -- multi-process tests ------------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_trackers_on_two_processes_write_rank0_values_once(tmp_path):
    project = str(tmp_path)
    log_with = ["jsonl", "csv", *OPTIONAL, "filetracker", "per_rank"]
    results = run_distributed(_log_run, 2, project, log_with, INIT_KWARGS, timeout=150, env=QUIET_ENV)
    expected_names = ["jsonl", "csv", *OPTIONAL, "filetracker", "per_rank"]
    for checks in results:
        assert checks["names"] == expected_names
        assert checks["jsonl_is_wrapper"] == "JSONLTracker"
        assert "'comet_ml'" in checks["missing_error"] and "'jsonl'" in checks["missing_error"]
        assert checks["after_end"] == 0
    if "tensorboard" in OPTIONAL:
        assert [c["tb_unwrapped"] for c in results] == ["SummaryWriter", "_Inactive"]
    check_jsonl(os.path.join(project, "proj"))
    check_csv(os.path.join(project, "proj"))
    check_optional(project, OPTIONAL, results[0])
    # the registered custom tracker: process 0 only, with config, log kwargs, start and finish
    with open(os.path.join(project, "proj.custom")) as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[0] == {"event": "start"} and lines[1] == {"event": "config", **CONFIG}
    assert [(ln["step"], ln["loss"], ln["extra"]) for ln in lines[2:-1]] == [(s, LOSSES[s], 10 * s) for s in range(4)]
    assert lines[-1] == {"event": "finish"}
    # the custom instance with main_process_only=False logged on both processes
    for rank in (0, 1):
        with open(os.path.join(project, f"rank_{rank}.json")) as handle:
            assert [r["loss"] for r in json.load(handle)] == [v + 100 * rank for v in LOSSES]


@pytest.mark.timeout(180)
def test_log_with_all_and_the_jsonl_default_on_two_processes(tmp_path):
    all_dir, default_dir = str(tmp_path / "all"), str(tmp_path / "default")
    env = {**QUIET_ENV, **offline_env(tmp_path / "offline")}
    results = run_distributed(_all_and_default, 2, all_dir, default_dir, timeout=240, env=env)
    assert results[0]["all"] == sorted(["jsonl", "csv", *OPTIONAL, *OFFLINE_ONLY])  # every installed tracker
    assert results[0]["default"] == results[1]["default"] == ["jsonl"]
    check_jsonl(os.path.join(all_dir, "proj"))
    check_csv(os.path.join(all_dir, "proj"))
    check_optional(all_dir, OPTIONAL)
    check_jsonl(os.path.join(default_dir, "proj"))
    assert os.listdir(default_dir) == ["proj"] and sorted(os.listdir(os.path.join(default_dir, "proj"))) == \
        ["config.json", "metrics.jsonl"]


# -- one-process unit tests -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,package", [("tensorboard", "tensorboard"), ("mlflow", "mlflow"),
                                          ("wandb", "wandb"), ("aim", "aim")])
def test_missing_package_error_names_it_and_all_skips_it(tmp_path, monkeypatch, name, package):
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ValueError, match=f"pip install {package}"):
        start_trackers([name], "proj", logging_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []  # failed before anything started
    assert name not in available_trackers() and "jsonl" in available_trackers()  # what "all" starts
    # the tracker's own start() says the same when the package disappears after checks
    from overdrive.tracking import tracker_class

    tracker = tracker_class(name)("proj", str(tmp_path))
    with pytest.raises(ImportError, match=f"pip install {package}"):
        tracker.start()


def test_unknown_names_and_missing_directory_reported_together(tmp_path):
    with pytest.raises(ValueError) as info:
        start_trackers(["tensorbord", "jsonl", 3], "proj", logging_dir=None)
    message = str(info.value)
    assert "'tensorbord'" in message and "valid trackers" in message and "'tensorboard'" in message
    assert "project_dir" in message  # jsonl needs a logging directory
    assert "got 3" in message
    with pytest.raises(ValueError, match="pass an instance"):
        start_trackers([FileTracker], "proj", logging_dir=str(tmp_path))


def test_default_without_project_dir_warns_and_logs_nothing(tmp_path):
    with pytest.warns(UserWarning, match="project_dir"):
        assert start_trackers((), "proj", logging_dir=None) == []
    trackers = start_trackers((), "proj", logging_dir=str(tmp_path))
    assert [t.name for t in trackers] == ["jsonl"]
    trackers[0].finish()


def test_main_process_only_trackers_do_nothing_on_other_processes(tmp_path):
    register_tracker("filetracker", FileTracker)
    trackers = start_trackers(["jsonl", "csv", "filetracker"], "proj", config=CONFIG, logging_dir=str(tmp_path),
                              process_index=1)
    for tracker in trackers:
        assert not tracker.is_active
        tracker.log({"loss": 1.0}, step=0)
        tracker.finish()
    assert os.listdir(tmp_path) == []  # nothing created, not even the run folder
    assert not find_tracker(trackers, "jsonl", unwrap=True)  # the no-op stand-in
    find_tracker(trackers, "jsonl", unwrap=True).anything(1, 2).goes()  # and it absorbs calls


def test_find_tracker_error_names_the_name_and_running_trackers(tmp_path):
    trackers = start_trackers(["csv"], "proj", logging_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"'wandb'.*\['csv'\]"):
        find_tracker(trackers, "wandb")
    assert find_tracker(trackers, "csv") is trackers[0]
    trackers[0].finish()


def test_register_tracker_validates_and_log_with_accepts_logger_type(tmp_path):
    from overdrive.config import LoggerType

    with pytest.raises(TypeError, match="GeneralTracker"):
        register_tracker("bad", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'all'"):
        register_tracker("all", FileTracker)
    register_tracker("filetracker", FileTracker)
    assert "filetracker" in tracker_names()
    if "tensorboard" in OPTIONAL:
        trackers = start_trackers([LoggerType.TENSORBOARD, "filetracker"], "proj", logging_dir=str(tmp_path),
                                  init_kwargs={"filetracker": {"suffix": ".x"}})
        assert [t.name for t in trackers] == ["tensorboard", "filetracker"]
        for tracker in trackers:
            tracker.finish()
        assert os.path.exists(tmp_path / "proj.x")  # init_kwargs reached the registered class


def test_jsonl_lines_are_on_disk_before_finish_and_a_torn_line_is_skipped(tmp_path):
    (tracker,) = start_trackers(["jsonl"], "proj", logging_dir=str(tmp_path))
    import torch

    tracker.log({"loss": torch.tensor(0.5), "acc": 0.25}, step=1)
    tracker.log({"loss": 0.25, "note": "eval"}, step=2)
    path = tmp_path / "proj" / "metrics.jsonl"
    records = read_metrics(path)  # read while the tracker is still open: nothing is buffered
    assert [(r["step"], r["loss"]) for r in records] == [(1, 0.5), (2, 0.25)] and records[1]["note"] == "eval"
    with open(path, "a") as handle:
        handle.write('{"step": 3, "loss"')  # what a crash mid-write leaves
    assert len(read_metrics(path)) == 2
    tracker.finish()


def test_csv_widens_its_header_when_a_new_metric_appears(tmp_path):
    (tracker,) = start_trackers(["csv"], "proj", logging_dir=str(tmp_path))
    tracker.log({"loss": 1.0}, step=0)
    tracker.log({"loss": 0.5, "eval": {"acc": 0.9}}, step=1)
    tracker.log({"loss": 0.25}, step=2)
    tracker.finish()
    with open(tmp_path / "proj" / "metrics.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["step", "time", "loss", "eval/acc"]
    assert [(r[0], r[2], r[3]) for r in rows[1:]] == [("0", "1.0", ""), ("1", "0.5", "0.9"), ("2", "0.25", "")]


@pytest.mark.requires("mlflow")
def test_mlflow_file_store_through_tracking_uri(tmp_path):
    uri = f"file:{tmp_path / 'store'}"
    (tracker,) = start_trackers(["mlflow"], "exp", config={"a": 1}, logging_dir=None,
                                init_kwargs={"mlflow": {"tracking_uri": uri, "run_name": "first"}})
    assert tracker.active_run.info.run_name == "first"
    for step in range(4):
        tracker.log(values_at(step, 0), step=step)
    tracker.finish()
    assert (tmp_path / "store").is_dir()
    metrics, params = read_mlflow(uri, "exp")
    assert_series(metrics, "mlflow file store")
    assert params == {"a": "1"}


def test_mlflow_default_store_is_sqlite_with_sqlalchemy_else_the_file_store(tmp_path, monkeypatch):
    from overdrive.tracking.mlflow import default_tracking_uri

    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    assert default_tracking_uri(str(tmp_path)) == f"file:{tmp_path / 'mlruns'}"
    monkeypatch.delitem(sys.modules, "sqlalchemy")
    if is_package_available("sqlalchemy") and is_package_available("alembic"):
        assert default_tracking_uri(str(tmp_path)) == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_mlflow_without_a_place_for_runs_says_what_to_pass(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # and MLflow never configured in this process
    from overdrive.tracking.mlflow import MLflowTracker

    with pytest.raises(ValueError, match="project_dir"):
        MLflowTracker("proj", None)


# -- overdrive plot -------------------------------------------------------------------------------------------

def _write_run(tmp_path) -> str:
    (tracker,) = start_trackers(["jsonl"], "run", logging_dir=str(tmp_path))
    for step in range(20):
        tracker.log({"loss": 3.0 / (step + 1), "lr": 1e-3 * (1 - step / 20),
                     "samples_per_sec": 100.0 + step}, step=step)
    tracker.log({"eval_loss": 0.5, "phase": "eval"}, step=19)
    tracker.finish()
    return str(tmp_path / "run")


@pytest.mark.requires("matplotlib")
def test_plot_writes_a_png_and_prints_first_last_min_max(tmp_path, capsys):
    from overdrive.cli.plot import plot_main

    run_dir = _write_run(tmp_path)
    assert plot_main([str(tmp_path)]) == 0  # the project folder holding one run works too
    out = capsys.readouterr().out
    png = os.path.join(run_dir, "metrics.png")
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 20_000  # four subplots with curves, not an empty canvas
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line.strip()}
    assert rows["loss"] == ["20", "3", "0.15", "0.15", "3"]
    assert rows["samples_per_sec"] == ["20", "100", "119", "100", "119"]
    assert rows["eval_loss"] == ["1", "0.5", "0.5", "0.5", "0.5"]
    assert "phase" not in rows  # strings are not curves
    assert plot_main([run_dir, "-m", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_package(tmp_path, monkeypatch, capsys):
    from overdrive.cli.plot import plot_main

    run_dir = _write_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot_main([run_dir]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err
    assert plot_main([run_dir, "--no-png"]) == 0
    assert not os.path.exists(os.path.join(run_dir, "metrics.png"))
