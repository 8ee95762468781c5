"""Accelerate's big-model behaviours that overdrive missed (issue 21), each compared with the real Accelerate:
a model all on disk runs (``dispatch_model`` and ``from_pretrained(device_map="auto")``), ``save_model`` of a
disk-offloaded model, ``infer_auto_device_map``'s buffer warning and its "insufficient memory" log, layerwise
casting that leaves norms alone, tied sizes counted once, unknown device-map keys warned about."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from overdrive.big_model import attach_layerwise_casting_hooks, dispatch_model, infer_auto_device_map
from overdrive.big_model.planning import check_device_map
from overdrive.big_model.sizes import get_module_size_with_ties

pytestmark = pytest.mark.requires("accelerate")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def real():
    """The real Accelerate's ``accelerate.utils.modeling`` / ``big_modeling`` (skips if the alias is on)."""
    import accelerate

    if "overdrive" in (accelerate.__spec__.name if accelerate.__spec__ else ""):
        pytest.skip("the alias is installed in this process")
    import accelerate.big_modeling as big
    import accelerate.utils.modeling as modeling

    return big, modeling


class Small(nn.Module):
    """Accelerate's ModelForTest: linear1, batchnorm, linear2."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1, self.batchnorm, self.linear2 = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


def test_dispatch_model_all_on_disk_runs_as_in_accelerate(tmp_path: Path) -> None:
    big, _ = real()
    x = torch.randn(2, 3)
    outputs = []
    for index, dispatch in enumerate((big.dispatch_model, dispatch_model)):
        torch.manual_seed(0)
        model = Small().eval()
        expected = model(x)
        dispatch(model, {"linear1": "disk", "batchnorm": "disk", "linear2": "disk"}, offload_dir=tmp_path / str(index))
        assert model.linear1.weight.device.type == "meta"  # the weights stay on disk
        outputs.append(model(x))
        torch.testing.assert_close(outputs[-1], expected)
    torch.testing.assert_close(outputs[0], outputs[1])


SAVE = """
import json, os, sys, tempfile, torch
if sys.argv[1] == "overdrive":
    import overdrive; overdrive.install_as_accelerate()
from accelerate import Accelerator, disk_offload
from safetensors.torch import load_file
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
folder = sys.argv[2]
disk_offload(model, os.path.join(folder, "offload"), execution_device="cpu")
Accelerator(cpu=True).save_model(model, os.path.join(folder, "out"))
print(json.dumps({k: v.tolist() for k, v in load_file(os.path.join(folder, "out", "model.safetensors")).items()}))
"""

PRETRAINED = """
import json, os, sys, torch
if sys.argv[1] == "overdrive":
    import overdrive; overdrive.install_as_accelerate()
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
folder = sys.argv[2]
GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).save_pretrained(folder)
reference = GPT2LMHeadModel.from_pretrained(folder).eval()
model = AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory={"cpu": 1},
                                             offload_folder=os.path.join(folder, "offload"))
x = torch.randint(0, 64, (1, 8))
with torch.no_grad():
    diff = (model(x).logits - reference(x).logits).abs().max().item()
print(json.dumps({"devices": sorted(set(map(str, model.hf_device_map.values()))), "diff": diff}))
"""


def _run(code: str, side: str, folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), side, str(folder)], capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_save_model_of_a_disk_offloaded_model_writes_its_weights(tmp_path: Path) -> None:
    ours, theirs = (_run(SAVE, side, tmp_path / side) for side in ("overdrive", "accelerate"))
    assert ours == theirs and ours


@pytest.mark.slow  # two interpreters importing transformers: ~40 s each on 2 busy cores
@pytest.mark.requires("transformers")
def test_from_pretrained_with_the_whole_model_on_disk_runs(tmp_path: Path) -> None:
    ours, theirs = (_run(PRETRAINED, side, tmp_path / side) for side in ("overdrive", "accelerate"))
    assert ours == theirs == {"devices": ["disk"], "diff": 0.0}


def _buffered() -> Small:
    model = Small()
    model.linear1.register_buffer("test_buffer1", torch.zeros(10, 2))
    model.batchnorm.register_buffer("test_buffer2", torch.zeros(10, 3))
    model.linear2.register_buffer("test_buffer3", torch.zeros(10, 3))
    return model


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_buffers_that_do_not_fit_warn_as_in_accelerate(offload_buffers: bool) -> None:
    _, modeling = real()
    results = []
    for plan in (modeling.infer_auto_device_map, infer_auto_device_map):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            device_map = plan(_buffered(), max_memory={0: 400, "cpu": "1GB"}, offload_buffers=offload_buffers)
        results.append((device_map, len([w for w in caught if "buffer" in str(w.message)])))
    assert results[0] == results[1]
    assert results[1][1] == (0 if offload_buffers else 1)


def test_a_device_left_empty_is_logged_as_in_accelerate(caplog: pytest.LogCaptureFixture) -> None:
    _, modeling = real()
    inner = nn.Sequential(OrderedDict([("linear1", nn.Linear(10, 4)), ("linear2", nn.Linear(4, 4)),
                                       ("linear3", nn.Linear(4, 8))]))
    model = nn.Sequential(OrderedDict([("module", inner)]))
    for fallback in (False, True):
        maps, logged = [], []
        for plan in (modeling.infer_auto_device_map, infer_auto_device_map):
            caplog.clear()
            with caplog.at_level(logging.INFO):
                maps.append(plan(model, max_memory={0: 256}, fallback_allocation=fallback))
            logged.append(any("insufficient memory" in r.getMessage() for r in caplog.records))
        assert maps[0] == maps[1] and logged[0] == logged[1] == (not fallback)


def test_layerwise_casting_leaves_norm_layers_alone() -> None:
    big, _ = real()
    dtypes = []
    for attach in (big.attach_layerwise_casting_hooks, attach_layerwise_casting_hooks):
        model = Small()
        attach(model, storage_dtype=torch.float16, compute_dtype=torch.float32)
        dtypes.append({name: p.dtype for name, p in model.named_parameters()})
        with torch.no_grad():
            model(torch.randn(2, 3))
    assert dtypes[0] == dtypes[1]
    assert dtypes[1]["batchnorm.weight"] == torch.float32 and dtypes[1]["linear1.weight"] == torch.float16


def test_tied_sizes_count_the_shared_weight_once() -> None:
    _, modeling = real()
    model = nn.ModuleList([nn.Linear(10, 10) for _ in range(15)])
    for i in range(1, 15):
        model[i].weight = model[i - 1].weight
    sizes = modeling.compute_module_sizes(model)
    tied = sorted(f"{i}.weight" for i in range(15))[1:]
    todo = list(model.named_children())[1:]
    theirs = modeling.get_module_size_with_ties(tied, sizes["0"], sizes, todo)
    assert get_module_size_with_ties(tied, sizes["0"], sizes, todo) == theirs


def test_unknown_device_map_keys_warn_as_in_accelerate() -> None:
    _, modeling = real()
    device_map = {"linear1": "cpu", "batchnorm": "cpu", "linear2": "cpu", "invalid_module": 0}
    for check in (modeling.check_device_map, check_device_map):
        with pytest.warns(UserWarning, match="device_map keys do not match any submodules.*invalid_module"):
            check(Small(), device_map)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_offloaded_weights_round_trip_with_accelerates_files(tmp_path: Path, dtype: torch.dtype) -> None:
    """fp8 weights (numpy has no fp8) are written as Accelerate writes them: each side reads the other's."""
    import accelerate.utils.offload as theirs  # the real module (real() checked the alias is off)

    from overdrive.big_model import offload as ours

    real()
    weight = torch.randn(2, 3).to(dtype)
    for write, read, folder in ((ours, theirs, tmp_path / "a"), (theirs, ours, tmp_path / "b")):
        folder.mkdir()
        index = write.offload_weight(weight, "w", str(folder), {})
        back = read.load_offloaded_weight(str(folder / "w.dat"), index["w"])
        assert back.dtype == dtype and torch.equal(back.view(torch.uint8), weight.view(torch.uint8))


@pytest.mark.parametrize("device_map", [None, {"": "cpu"}])
def test_unexpected_checkpoint_keys_are_logged_or_refused_as_in_accelerate(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, device_map: dict | None) -> None:
    _, modeling = real()
    from overdrive.big_model import load_checkpoint_in_model

    state = Small().state_dict()
    state["foo"] = torch.rand(4, 5)
    torch.save(state, tmp_path / "model.pt")
    for load in (modeling.load_checkpoint_in_model, load_checkpoint_in_model):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            load(Small(), str(tmp_path / "model.pt"), device_map=device_map)
        assert any("were not used when" in r.getMessage() and "foo" in r.getMessage() for r in caplog.records)
        with pytest.raises((ValueError, RuntimeError)):
            load(Small(), str(tmp_path / "model.pt"), device_map=device_map, strict=True)
