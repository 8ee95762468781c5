"""A failed ``load_state`` changes nothing: model, optimizer, scheduler, scaler, data position, RNG,
counters and registered objects are compared with ``torch.equal`` after every kind of failure."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from overdrive.checkpoint import CheckpointError
from overdrive.checkpoint.storage import checksum
from overdrive.training.state import GradientState
from tests.checkpoint.test_checkpoint_distributed import same, setup, snapshot, train


class Picky:
    """A registered object: its state can hold a set (only picklable) and its loading can be made to fail."""

    def __init__(self) -> None:
        self.value, self.fail = {1, 2}, False

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.fail and state["value"] == {"plain": 1}:  # the checkpoint's state (taking its own back is fine)
            raise RuntimeError("Picky refuses this state")
        self.value = state["value"]


@pytest.fixture(autouse=True)
def _fresh_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def _everything(run, picky) -> dict[str, Any]:
    return {**snapshot(run), "python_rng": random.getstate(), "picky": set(picky.value),
            "window": run.acc.window.state_dict()}


def _fix_manifest(folder: Path, name: str) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name].update(size=(folder / name).stat().st_size, crc32=checksum(folder / name))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_every_failed_load_leaves_the_run_exactly_as_it_was(tmp_path):
    run = setup(0)
    picky = Picky()
    run.acc.register_for_checkpointing(picky)
    train(run, 4)
    with pytest.warns(UserWarning, match="pickle"):
        saved = Path(run.acc.save_state(tmp_path / "with_set", layout="resharding"))
    picky.value = {"plain": 1}  # json-friendly: a second checkpoint any load can read
    good = Path(run.acc.save_state(tmp_path / "plain", layout="resharding"))
    train(run, 9)  # everything moves on: the loads below would take it back to step 4
    picky.value = {3}
    next(iter(run.loader))  # a data position mid-epoch
    before = _everything(run, picky)

    failures = []
    with pytest.raises(CheckpointError, match="allow_pickle"):  # the case: a set, no allow_pickle
        run.acc.load_state(saved)
    failures.append(_everything(run, picky))

    picky.fail = True  # a registered object whose load_state_dict raises, after others were applied
    with pytest.raises((CheckpointError, RuntimeError), match="Picky refuses this state"):
        run.acc.load_state(good)
    failures.append(_everything(run, picky))
    picky.fail = False

    broken = tmp_path / "broken_rng"  # a rank file whose RNG record cannot be decoded (manifest fixed up)
    broken.mkdir()
    for path in good.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    record = json.loads((broken / "rank_0.json").read_text())
    record["rng"] = {"torch": {"__tensor__": "nonsense"}}
    (broken / "rank_0.json").write_text(json.dumps(record))
    _fix_manifest(broken, "rank_0.json")
    with pytest.raises(Exception):  # noqa: B017 - whichever error decoding gives; what matters is below
        run.acc.load_state(broken)
    failures.append(_everything(run, picky))

    damaged = tmp_path / "damaged"  # a data file changed after the save: caught by the checksums
    damaged.mkdir()
    for path in good.iterdir():
        (damaged / path.name).write_bytes(path.read_bytes())
    data = bytearray((damaged / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        run.acc.load_state(damaged)
    failures.append(_everything(run, picky))

    for i, after in enumerate(failures):
        for key in before:
            assert same(after[key], before[key]), f"failure {i}: {key} changed"
    # and a good load still restores step 4's state
    run.acc.load_state(good)
    assert run.acc.step == 4 and picky.value == {"plain": 1}
