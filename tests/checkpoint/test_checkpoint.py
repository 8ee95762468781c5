"""Checkpoints in one process: exact resume, naming and total_limit, safe loading, damaged and mismatched
checkpoints, the safetensors export and merge-weights."""

from __future__ import annotations

import fractions
import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from overdrive import Accelerator
from overdrive.checkpoint import CheckpointError, merge_weights_main
from overdrive.checkpoint.codec import decode, encode
from overdrive.checkpoint.storage import SafeLoadPlanner, checksum
from overdrive.training.state import GradientState
from tests.checkpoint.test_checkpoint_distributed import BATCH, Run, same, setup, snapshot, train


@pytest.fixture(autouse=True)
def _fresh_gradient_state() -> Any:
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def _saved_run(tmp_path: Path, steps: int = 6, layout: str = "accelerate") -> tuple[Run, Path]:
    run = setup(0)
    train(run, steps)
    return run, Path(run.acc.save_state(tmp_path / "ckpt", layout=layout))


# -- exact resume ---------------------------------------------------------------------------------
def test_resume_is_exact_and_skip_first_batches_agrees(tmp_path: Path) -> None:
    run = setup(0)
    saved: dict[str, Any] = {}
    ref = train(run, 40, lambda step: step == 10 and saved.update(path=run.acc.save_state(tmp_path / "c")))
    resumed = setup(5)  # another seed: everything comes from the checkpoint
    resumed.acc.load_state(saved["path"])
    resumed.acc.skip_first_batches(resumed.loader, 10)  # what Accelerate scripts add: sets the same position
    assert train(resumed, 40) == ref[10:]
    assert same(snapshot(resumed)["model"], snapshot(run)["model"])
    assert same(snapshot(resumed)["opt"], snapshot(run)["opt"])

    fresh = setup(0)
    loader = fresh.acc.skip_first_batches(fresh.loader, 10)
    assert [idx.tolist() for _, _, idx in loader][:5] == [r[1] for r in ref[10:15]]
    assert len(ref[10][1]) == BATCH


def _recipe_run(checkpoint: Path, resume: bool, seed: int, epochs: int = 3) -> dict[str, torch.Tensor]:
    """Accelerate's resume recipe (its examples/by_feature/checkpointing.py) with ``exact_resume``: save at
    overall step 14 of 3 epochs of 10 batches; resumed, the starting epoch and the batches to skip come from
    ``len(train_dataloader)`` after ``load_state``."""
    from overdrive import DataLoaderConfiguration

    GradientState._reset_state()
    torch.manual_seed(seed)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(exact_resume=True))
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.arange(160.0).reshape(40, 4) / 160, torch.ones(40, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, loader)
    starting_epoch, resume_step, overall_step = 0, None, 0
    if resume:
        accelerator.load_state(checkpoint)
        assert len(train_dataloader) == 10  # the epoch's length, not the batches left in it
        resume_step = 14
        starting_epoch = resume_step // len(train_dataloader)
        resume_step -= starting_epoch * len(train_dataloader)
        overall_step = starting_epoch * len(train_dataloader)
    for epoch in range(starting_epoch, epochs):
        active = train_dataloader
        if resume and epoch == starting_epoch and resume_step is not None:
            active = accelerator.skip_first_batches(train_dataloader, resume_step)
            overall_step += resume_step
        for x, y in active:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            overall_step += 1
            if not resume and overall_step == 14:
                accelerator.save_state(checkpoint)
    assert overall_step == epochs * 10
    return {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def test_accelerates_resume_recipe_with_exact_resume(tmp_path: Path) -> None:
    uninterrupted = _recipe_run(tmp_path / "step_14", resume=False, seed=0)
    resumed = _recipe_run(tmp_path / "step_14", resume=True, seed=7)  # everything comes from the checkpoint
    assert same(resumed, uninterrupted)


def test_optimizer_without_state_and_parameters_without_state(tmp_path: Path) -> None:
    run = setup(0)
    params = [p.detach().clone() for p in run.model.parameters()]
    path = run.acc.save_state(tmp_path / "step0")  # before the first step: no optimizer state yet
    assert not run.opt.state and all(torch.equal(a, b) for a, b in zip(params, run.model.parameters()))
    other = setup(1)
    other.acc.load_state(path)
    assert not other.opt.state and same(snapshot(other)["model"], snapshot(run)["model"])

    # a parameter that never receives a gradient has no Adam state: it must stay without one
    acc = Accelerator()
    model = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    model, opt = acc.prepare(model, torch.optim.Adam(model.parameters(), lr=0.1))
    model["used"](torch.randn(4, 3)).sum().backward()
    opt.step()
    path = acc.save_state(tmp_path / "partial")
    acc2 = Accelerator()
    model2 = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    model2, opt2 = acc2.prepare(model2, torch.optim.Adam(model2.parameters(), lr=0.1))
    acc2.load_state(path)
    assert len(opt2.state) == 2 and same(opt2.state_dict(), opt.state_dict())


# -- naming, total_limit, atomic replacement ------------------------------------------------------
def test_automatic_naming_total_limit_and_newest(tmp_path: Path) -> None:
    run = setup(0, project_dir=str(tmp_path), total_limit=2)
    root = tmp_path / "checkpoints"
    (root / ".checkpoint_9.tmp-deadbeef").mkdir(parents=True)  # an interrupted save ...
    os.utime(root / ".checkpoint_9.tmp-deadbeef", (0, 0))  # ... long ago: provably stale, so it is cleaned
    (root / "checkpoint_50").mkdir()  # no manifest: not complete
    for step in (2, 4, 6, 8):
        train(run, step)
        run.acc.save_state()
    assert run.acc.project_configuration.iteration == 4
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_2", "checkpoint_3", "checkpoint_50"]
    other = setup(1, project_dir=str(tmp_path))
    assert Path(other.acc.load_state()).name == "checkpoint_3"
    assert other.acc.step == 8 and other.acc.project_configuration.iteration == 4
    with pytest.raises(CheckpointError, match="already exists"):
        other.acc.project_configuration.iteration = 3
        other.acc.save_state()

    empty = setup(1, project_dir=str(tmp_path / "nothing"))
    with pytest.raises(CheckpointError, match=r"no complete checkpoint in .*nothing[/\\]checkpoints"):
        empty.acc.load_state()


def test_overwriting_a_checkpoint_and_refusing_other_folders(tmp_path: Path) -> None:
    run, path = _saved_run(tmp_path, 2)
    train(run, 4)
    assert run.acc.save_state(path) == str(path)  # replaced atomically
    assert json.loads((path / "manifest.json").read_text())["contents"]["step"] == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not an overdrive checkpoint"):
        run.acc.save_state(precious)
    assert (precious / "notes.txt").read_text() == "keep me"


# -- damaged and mismatched checkpoints -----------------------------------------------------------
@pytest.mark.parametrize(("layout", "name"), [("resharding", "__0_0.distcp"), ("accelerate", "model.safetensors")])
def test_truncated_and_corrupted_files_are_named(tmp_path: Path, layout: str, name: str) -> None:
    _, path = _saved_run(tmp_path, layout=layout)
    data = path / name
    original = data.read_bytes()
    data.write_bytes(original[:-100])
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} is \d+ bytes but the manifest says \d+"):
        setup(1).acc.load_state(path)
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0xFF
    data.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} has checksum \w+ but the manifest says \w+"):
        setup(1).acc.load_state(path)
    data.write_bytes(original)
    (path / "manifest.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="manifest.json is not valid JSON"):
        setup(1).acc.load_state(path)
    shutil.rmtree(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        setup(1).acc.load_state(path)


def test_incompatible_model_names_the_keys(tmp_path: Path) -> None:
    _, path = _saved_run(tmp_path, layout="resharding")
    acc = Accelerator()
    wider = nn.Sequential(nn.Linear(6, 64), nn.Dropout(0.3), nn.Tanh(), nn.Linear(64, 1), nn.Linear(1, 1))
    wider = acc.prepare(wider)
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    message = str(info.value)
    assert "shapes differ: 0.weight (checkpoint (32, 6), this run (64, 6))" in message
    assert "missing in the checkpoint: 4.weight, 4.bias" in message
    assert "holds 1 optimizers (this run has 0)" in message
    assert same(before, wider.state_dict())  # nothing was changed


# -- safe loading ---------------------------------------------------------------------------------
class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("touch pwned",))


def test_nothing_is_unpickled_without_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, path = _saved_run(tmp_path, layout="resharding")
    (path / ".metadata").write_bytes(pickle.dumps(_Evil()))
    manifest = json.loads((path / "manifest.json").read_text())  # an attacker controls the manifest too
    manifest["files"][".metadata"].update(size=(path / ".metadata").stat().st_size,
                                          crc32=checksum(path / ".metadata"))
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"refers to posix\.system.*not unpickled"):
        setup(1).acc.load_state(path)
    assert not (tmp_path / "pwned").exists()

    planner = SafeLoadPlanner()
    planner.state_dict, planner.original_state_dict = {}, {}
    buffer = io.BytesIO()
    torch.save(_Evil(), buffer)
    buffer.seek(0)
    item = type("Item", (), {"dest_index": type("Index", (), {"fqn": "x"})()})()
    with pytest.raises(CheckpointError, match="was not unpickled"):
        planner.load_bytes(item, buffer)
    assert not (tmp_path / "pwned").exists()


class _Odd:
    """A registered object whose state holds a set (JSON has none): saved with pickle, loaded on opt-in."""

    def __init__(self) -> None:
        self.seen = {1, 2}

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_registered_objects_hooks_and_pickle_opt_in(tmp_path: Path) -> None:
    acc = Accelerator()
    with pytest.raises(ValueError, match="1: object"):
        acc.register_for_checkpointing(_Odd(), object())
    model = acc.prepare(nn.Linear(2, 2))
    acc.register_for_checkpointing(_Odd())

    def save_it_myself(models: list, weights: list, out: str) -> None:
        weights.pop()
        Path(out, "my_model.txt").write_text("saved by the hook")

    popped = acc.register_save_state_pre_hook(save_it_myself)
    with pytest.warns(UserWarning, match="custom_0.seen could only be saved with pickle"):
        path = acc.save_state(tmp_path / "c", layout="resharding")
    accelerate_path = acc.save_state(tmp_path / "a")  # Accelerate's layout: custom_checkpoint_0.pkl, torch.save
    popped.remove()
    assert not {"model.safetensors", "pytorch_model.bin"} & set(os.listdir(accelerate_path))  # the hook saved it
    assert Path(path, "my_model.txt").read_text() == "saved by the hook"
    assert json.loads(Path(path, "manifest.json").read_text())["files"]["my_model.txt"]["rank"] is None
    assert "model_0.weight" not in (path_text := (Path(path) / "state.json").read_text()) and '"models":[]' in path_text

    acc2 = Accelerator()
    acc2.prepare(nn.Linear(2, 2))
    odd = _Odd()
    odd.seen = set()
    acc2.register_for_checkpointing(odd)
    calls = []
    acc2.register_load_state_pre_hook(lambda models, folder: calls.append(models.pop()))
    with pytest.raises(CheckpointError, match="custom_0.seen holds a builtins.set .* allow_pickle=True"):
        acc2.load_state(path)
    acc2.load_state(path, allow_pickle=True)
    assert odd.seen == {1, 2} and len(calls) == 2
    odd.seen = set()
    acc2.load_state(accelerate_path)  # a set is among the values torch's weights_only reader rebuilds
    assert odd.seen == {1, 2} and len(calls) == 3
    del model


def test_registered_objects_in_accelerates_layout_unpickle_as_accelerate(tmp_path: Path) -> None:
    acc = Accelerator()
    acc.prepare(nn.Linear(2, 2))
    odd = _Odd()
    odd.seen = fractions.Fraction(1, 3)  # only a full unpickler rebuilds it
    acc.register_for_checkpointing(odd)
    path = acc.save_state(tmp_path / "a")
    odd.seen = None
    with pytest.raises(CheckpointError, match="custom_checkpoint_0.pkl: holds pickled Python objects"):
        acc.load_state(path, allow_pickle=False)  # overdrive's stricter switch
    assert odd.seen is None  # nothing was changed
    acc.load_state(path)  # by default as Accelerate: its load_custom_state unpickles in full
    assert odd.seen == fractions.Fraction(1, 3)


def test_codec_round_trip() -> None:
    value = {"t": (1, 2.5, float("inf")), 3: [None, True, "s"], "a": np.arange(3, dtype=np.uint32),
             "x": torch.arange(4, dtype=torch.bfloat16), "dtype": torch.float16, "__tuple__": 1,
             "n": np.float64(0.5), "size": torch.Size([2, 3]), "nan": float("nan")}
    data = json.loads(json.dumps(encode(value), allow_nan=False))
    back = decode(data)
    assert back["t"] == (1, 2.5, float("inf")) and back[3] == [None, True, "s"] and back["__tuple__"] == 1
    assert back["a"].dtype == np.uint32 and back["a"].tolist() == [0, 1, 2] and back["n"] == 0.5
    assert torch.equal(back["x"], value["x"]) and back["dtype"] is torch.float16 and back["size"] == (2, 3)
    assert back["nan"] != back["nan"]


# -- the safetensors export -----------------------------------------------------------------------
class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_save_model_shards_single_file_and_tied_weights(tmp_path: Path) -> None:
    acc = Accelerator()
    model = acc.prepare(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    acc.save_model(model, tmp_path / "sharded", max_shard_size="300B")
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert files[-1] == "model.safetensors.index.json" and files[0] == "model-00001-of-00003.safetensors"
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    merged = {}
    for name in files[:-1]:
        merged.update(load_file(tmp_path / "sharded" / name))
    assert set(index["weight_map"]) == set(merged)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    plain.load_state_dict(merged)
    assert same(plain.state_dict(), {k: v.detach() for k, v in model.state_dict().items()})

    acc.save_model(model, tmp_path / "sharded")  # fits in one file now: old shards and index go
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == ["model.safetensors"]

    tied = _Tied()
    acc.save_model(tied, tmp_path / "tied")
    with safe_open(tmp_path / "tied" / "model.safetensors", "pt") as f:
        assert list(f.keys()) == ["embed.weight"]
        assert json.loads(f.metadata()["tied_weights"]) == {"head.weight": "embed.weight"}
    acc.save_model(model, tmp_path / "bin", safe_serialization=False)
    loaded = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    assert same(loaded, {k: v.detach() for k, v in model.state_dict().items()})


@pytest.mark.parametrize("layout", ["accelerate", "resharding"])
def test_merge_weights_in_one_process(tmp_path: Path, capsys: pytest.CaptureFixture, layout: str) -> None:
    run, path = _saved_run(tmp_path, layout=layout)
    assert merge_weights_main([str(path), str(tmp_path / "out")]) == 0
    assert same(load_file(tmp_path / "out" / "model.safetensors"), snapshot(run)["model"])
    capsys.readouterr()
    # user mistakes are usage errors (2), as documented; the output folder is never overwritten silently
    assert merge_weights_main([str(path), str(tmp_path / "o2"), "--model-index", "3"]) == 2
    assert "holds no weights for model 3" in capsys.readouterr().err
    assert merge_weights_main(["--bogus"]) == 2
    assert merge_weights_main([str(tmp_path / "nope"), str(tmp_path / "o3")]) == 2
    assert f"checkpoint folder {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    before = (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns
    assert merge_weights_main([str(path), str(tmp_path / "out")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns == before
    assert merge_weights_main([str(path), str(tmp_path / "out"), "--overwrite"]) == 0
    assert same(load_file(tmp_path / "out" / "model.safetensors"), snapshot(run)["model"])
    (path / "manifest.json").write_text("{}")  # a damaged checkpoint is not a usage error
    assert merge_weights_main([str(path), str(tmp_path / "o4")]) == 1


def test_register_for_checkpointing_names_each_object_without_state_dict() -> None:
    # Accelerate's wording (its test_state_checkpointing.py::test_invalid_registration reads it)
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError) as error:
        Accelerator().register_for_checkpointing(torch.tensor([1]), torch.tensor([2]), net,
                                                 torch.optim.SGD(net.parameters(), lr=0.1))
    message = str(error.value)
    assert "Item at index 0" in message and "Item at index 1" in message
    assert "Item at index 2" not in message and "Item at index 3" not in message


def test_a_folder_of_an_earlier_overdrive_loads(tmp_path: Path) -> None:
    """Earlier versions wrote the DCP layout with no "layout" entry in the manifest or state.json."""
    run, path = _saved_run(tmp_path, layout="resharding")
    for name, drop in (("state.json", lambda d: d.pop("layout")), ("manifest.json", lambda d: d["contents"].pop("layout"))):
        data = json.loads((path / name).read_text())
        drop(data)
        (path / name).write_text(json.dumps(data))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["state.json"].update(size=(path / "state.json").stat().st_size, crc32=checksum(path / "state.json"))
    (path / "manifest.json").write_text(json.dumps(manifest))
    other = setup(1)
    other.acc.load_state(path)
    assert same(snapshot(other)["model"], snapshot(run)["model"])


def test_the_default_folder_is_accelerates_with_small_extras(tmp_path: Path) -> None:
    run, path = _saved_run(tmp_path)
    names = set(os.listdir(path))
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "manifest.json", "state.json",
            "rank_0.json"} <= names
    assert not any(n.endswith(".distcp") or n == ".metadata" for n in names)  # the model is written once
    assert "weight" not in (path / "state.json").read_text()  # the extras hold counters and positions only
    with pytest.raises(ValueError, match="layout must be one of 'accelerate', 'resharding'"):
        run.acc.save_state(tmp_path / "x", layout="dcp")
