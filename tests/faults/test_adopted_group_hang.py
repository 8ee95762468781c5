"""A hung rank on a process group made outside overdrive (as Ray Train's ``TorchTrainer`` makes one): the
Accelerator adopts the group, starts the hang watchdog on it, and a timed-out collective is reported before
its error leaves overdrive, because the framework that made the group may catch the error (Ray Train does;
here the rank's function catches it, and ``sys.excepthook`` never runs). The report is the launcher's
(tests/faults/test_launcher_faults.py), and the error carries its first lines as a note.

Real gloo groups of 2 CPU processes: one whose store is a TCP store (``env://``, Ray Train's default, shared
with the watchdog), one whose store is a file (rank 0 then makes a TCP store and announces it over the group).
The run under Ray Train itself is in tests/launchers/test_ray_train.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from datetime import timedelta

import pytest

from tests.support.distributed import run_distributed

TIMEOUT_S = 4
pytestmark = pytest.mark.multiprocess


def _hang_on_an_adopted_group(store_kind: str, verb: str, folder: str) -> dict:
    import torch
    import torch.distributed as dist

    from overdrive import Accelerator
    from overdrive.runtime import watchdog

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=TIMEOUT_S)
    if store_kind == "tcp":  # the script makes the group itself, as Ray Train's workers do
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)
    else:
        store = dist.FileStore(os.path.join(folder, "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    accelerator = Accelerator()
    dog = watchdog.active()
    assert dog is not None and dog.adopted and dog.timeout == timeout, dog
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1))
    seen = {"rank": rank, "store": dog.store_address, "model": type(model).__name__,
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
    err = io.StringIO()
    for step in range(3):
        if step == 2 and rank == 1:  # the hung rank, until the report is out (no Ray to kill it here)
            deadline = time.monotonic() + 60
            with contextlib.suppress(dist.DistError):  # rank 0, the store's host, ended after its report
                while not dog.main_store.check(["report"]) and time.monotonic() < deadline:
                    time.sleep(0.2)  # where the hung rank is
            return seen
        loss = model(torch.randn(8, 4)).pow(2).mean()
        started = time.monotonic()
        try:  # what Ray Train does with an error of the training function: catch it, report it elsewhere
            with contextlib.redirect_stderr(err):
                if verb == "backward":  # DDP's all-reduce, inside the Accelerator's backward
                    accelerator.backward(loss)
                else:  # a collective verb (the others are marked the same way)
                    accelerator.reduce(loss.detach(), "mean")
        except Exception as error:  # noqa: BLE001 - the framework's catch
            seen.update(error=str(error), notes=list(getattr(error, "__notes__", [])), report=err.getvalue(),
                        waited=time.monotonic() - started)
            return seen
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("store_kind", "verb"), [("tcp", "backward"), ("file", "reduce")])
def test_a_hang_on_an_adopted_group_is_reported_before_the_error_leaves_overdrive(tmp_path, store_kind, verb):
    waiting, hung = run_distributed(_hang_on_an_adopted_group, 2, store_kind, verb, str(tmp_path), timeout=100)
    assert waiting["model"] == "DistributedDataParallel"
    # the watchdog's store: the group's own where it is a TCP store, else one rank 0 announced over the group
    assert waiting["store"] == hung["store"]
    assert (waiting["store"] == waiting["master"]) == (store_kind == "tcp"), waiting
    report, notes = waiting["report"], waiting["notes"]
    # the launcher's report (tests/faults/test_launcher_faults.py), from the waiting rank, before the error left
    headline = f"overdrive: hang detected: rank 0 waited {TIMEOUT_S} s in collective #"
    summary = json.loads(report.split("overdrive-hang-report: ")[1].splitlines()[0])
    # the collective torch's flight recorder saw: DDP's all-reduce; reduce's own collective (ops' business)
    name = "gloo:all_reduce" if verb == "backward" else summary["collective"]
    assert summary["collective"] == name and name.startswith("gloo:all_"), summary
    assert summary["hung_ranks"] == [1] and summary["waiting_rank"] == 0, summary
    assert headline in report and f"({name}) and timed out; rank 1 did not arrive." in report, report
    assert report.split("overdrive: hang detected")[1].splitlines()[1].startswith("overdrive: what to do:")
    assert "<- did not arrive" in report.split("-- rank 1:")[1].splitlines()[0]
    assert "time.sleep(0.2)  # where the hung rank is" in report.split("-- rank 1:")[1]
    # where the waiting rank waits: the script's line, though the error was caught inside overdrive
    where = "accelerator.backward(loss)" if verb == "backward" else 'accelerator.reduce(loss.detach(), "mean")'
    assert where in report.split("-- rank 0:")[1].split("-- rank 1:")[0], report
    # the error the framework catches carries the report's first lines (Ray Train shows them to the driver)
    if sys.version_info >= (3, 11):  # exceptions take notes from 3.11
        assert len(notes) == 1 and notes[0].startswith(headline) and "rank 1 did not arrive" in notes[0], notes
        assert "init_process_group(timeout=...)" in notes[0]  # where an adopted group's timeout is set
        assert notes[0].endswith("overdrive: every rank's stack: the hang report on rank 0's stderr"), notes
        assert "-- rank" not in notes[0]  # the stacks stay in the report
    assert waiting["waited"] < TIMEOUT_S + 12, waiting["waited"]
