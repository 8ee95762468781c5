"""``ClearMLTracker`` in ClearML's offline mode writes what the real Accelerate's writes: scalars (series from
the ``eval_`` / ``test_`` / ``train_`` prefixes), single values, the configuration, images (``log_images``) and
tables (``log_table``); the same script under the real Accelerate and under the alias."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate", "clearml")]


def _clearml(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process
    whose working folder is a new temporary one."""
    import json
    import os
    from pathlib import Path

    os.environ["CLEARML_CACHE_DIR"] = os.path.abspath("clearml")
    # reports from a thread rather than ClearML's default subprocess, whose close waits out its flush periods
    Path("clearml.conf").write_text("sdk { development { report_use_subprocess: false } }\n")
    os.environ["CLEARML_CONFIG_FILE"] = os.path.abspath("clearml.conf")
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    import numpy as np
    from accelerate import Accelerator
    from clearml import Task
    from clearml.config import get_offline_dir

    Task.set_offline(True)
    # no repository detection: Task.close() waits for it (a git subprocess in a thread), up to 300 s
    quiet = {"auto_connect_frameworks": {"detect_repository": False}, "auto_resource_monitoring": False}
    accelerator = Accelerator(cpu=True, log_with="clearml")
    accelerator.init_trackers("compare", config={"lr": 0.1, "name": "x"}, init_kwargs={"clearml": quiet})
    accelerator.log({"loss": 1.5, "eval_acc": 0.5, "test_f1": 0.25, "note": "dropped"}, step=2)
    accelerator.log({"final": 3.0})
    tracker = accelerator.get_tracker("clearml")
    image = np.eye(32, dtype=np.uint8) * 255
    tracker.log_images({"eval_image": image, "other": image}, step=1)
    tracker.log_table("with columns", columns=["A", "B"], data=[[1, 2], [3, 4]])
    tracker.log_table("eval_rows", data=[["C", "D"], [5, 6]], step=4)
    try:
        tracker.log_table("empty")
        refused = None
    except ValueError as exc:
        refused = type(exc).__name__
    folder = Path(get_offline_dir(task_id=accelerator.get_tracker("clearml", unwrap=True).id))
    accelerator.end_training()
    events = [event for line in (folder / "metrics.jsonl").read_text().splitlines() for event in json.loads(line)]
    task = json.loads((folder / "task.json").read_text())

    def plot(event: dict) -> object:
        data = json.loads(event["plot_str"])["data"][0]
        return data["header"]["values"], data["cells"]["values"]

    return {
        "scalars": sorted((e["type"], e["metric"], e["variant"], e.get("iter"), e.get("value")) for e in events
                          if "value" in e),
        "images": sorted((e["metric"], e["variant"], e.get("iter")) for e in events if e["type"] == "training_debug_image"),
        "image_files": len(list((folder / "data").rglob("*.jpeg"))),
        "tables": sorted((e["metric"], e["variant"], e.get("iter"), str(plot(e))) for e in events if "plot_str" in e),
        "configuration": task["configuration"]["General"]["value"], "project_task": task["name"],
        "refused": refused,
    }


def test_clearml_tracker_matches_accelerate():
    theirs = run_function(_clearml, "accelerate")
    ours = run_function(_clearml, "overdrive")
    assert ours == theirs
    assert theirs["image_files"] == 2 and len(theirs["tables"]) == 2 and theirs["refused"] == "ValueError"
    assert ("training_stats_scalar", "acc", "eval", 2, 0.5) in theirs["scalars"]
