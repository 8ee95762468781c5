"""load_state of a folder written by the real Accelerate's save_state: model, optimizer, scheduler, scaler,
RNG, step and custom objects land where they belong; a pickled object without allow_pickle is refused with
nothing changed; what has no place to go is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.requires("accelerate")]
SRC = str(Path(__file__).resolve().parents[2] / "src")

COMMON = """
import json, sys, torch
from torch.utils.data import DataLoader, TensorDataset
import fractions
RICH = sys.argv[2] == "rich"
class Counter:
    def __init__(self): self.count = 0
    def state_dict(self):  # "rich": a Python object only a full unpickler rebuilds
        return {"count": fractions.Fraction(self.count, 3) if RICH else self.count}
    def load_state_dict(self, state): self.count = int(state["count"] * 3) if RICH else state["count"]
def objects(shuffle):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    return model, optimizer, scheduler, DataLoader(data, batch_size=4, shuffle=shuffle)
def summary(model, optimizer, scheduler, counter, step):
    state = optimizer.state_dict()["state"]
    return {"params": [p.detach().flatten().tolist() for p in model.parameters()],
            "exp_avg": state[0]["exp_avg"].flatten().tolist() if state else None,
            "lr": scheduler.get_last_lr(), "last_epoch": scheduler.scheduler.last_epoch, "count": counter.count,
            "step": step, "rand": torch.rand(3).tolist()}
"""

SAVE = COMMON + """
from accelerate import Accelerator
folder, shuffle = sys.argv[1], sys.argv[2] == "shuffle"
accelerator = Accelerator(cpu=True)
model, optimizer, scheduler, loader = accelerator.prepare(*objects(shuffle))
counter = Counter()
accelerator.register_for_checkpointing(counter)
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step(); scheduler.step(); optimizer.zero_grad()
    counter.count += 1
    if i == 2:
        break
accelerator.save_state(folder)
print("RESULT", json.dumps(summary(model, optimizer, scheduler, counter, accelerator.step)))
"""

LOAD = COMMON + """
from overdrive import Accelerator
from overdrive.checkpoint import CheckpointError
folder, shuffle, allow = sys.argv[1], sys.argv[2] == "shuffle", sys.argv[3] == "allow"
accelerator = Accelerator(cpu=True)
model, optimizer, scheduler, loader = accelerator.prepare(*objects(shuffle))
counter = Counter()
accelerator.register_for_checkpointing(counter)
before = [p.detach().clone() for p in model.parameters()]
try:
    accelerator.load_state(folder, allow_pickle=allow)
except CheckpointError as exc:
    unchanged = all(bool((a == b).all()) for a, b in zip(before, model.parameters()))
    print("RESULT", json.dumps({"error": str(exc), "unchanged": unchanged, "count": counter.count}))
    sys.exit(0)
print("RESULT", json.dumps(summary(model, optimizer, scheduler, counter, accelerator.step)))
"""


def _run(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    for key in [k for k in env if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "ACCELERATE_"))]:
        env.pop(key)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [row for row in proc.stdout.splitlines() if row.startswith("RESULT")][-1]
    return json.loads(line.split(" ", 1)[1])


def test_a_checkpoint_without_pickled_objects_loads_completely(tmp_path):
    saved = _run(SAVE, str(tmp_path / "ckpt"), "ordered")
    loaded = _run(LOAD, str(tmp_path / "ckpt"), "ordered", "no")
    assert loaded == saved  # weights, Adam moments, LR schedule, custom object, step, RNG stream


def test_a_pickled_object_is_refused_without_allow_pickle_and_loads_with_it(tmp_path):
    saved = _run(SAVE, str(tmp_path / "ckpt"), "rich")
    refused = _run(LOAD, str(tmp_path / "ckpt"), "rich", "no")
    assert "custom_checkpoint_0.pkl" in refused["error"] and "allow_pickle=True" in refused["error"]
    assert "nothing was loaded" in refused["error"] and refused["unchanged"] and refused["count"] == 0
    loaded = _run(LOAD, str(tmp_path / "ckpt"), "rich", "allow")
    assert loaded == saved


TIED = """
import json, sys, torch
class Tiny(torch.nn.Module):  # GPT-2's shape: the output layer is the input embedding (one tensor, two names)
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 8)
        self.body = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 10, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("mask", torch.ones(3), persistent=False)  # left out of every state dict
    def forward(self, ids):
        return self.lm_head(torch.tanh(self.body(self.wte(ids))))
def build(accelerator, seed):
    torch.manual_seed(seed)
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return accelerator.prepare(model, optimizer)
def train(accelerator, model, optimizer):
    torch.manual_seed(5)
    for _ in range(3):
        ids = torch.randint(0, 10, (4, 6))
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
def summary(model, optimizer):
    inner = getattr(model, "module", model)
    return {"sd": {k: v.flatten().tolist() for k, v in inner.state_dict().items()},
            "tied": inner.lm_head.weight is inner.wte.weight,
            "exp_avg": [s["exp_avg"].flatten().tolist() for s in optimizer.state_dict()["state"].values()]}
"""

TIED_SAVE = TIED + """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model, optimizer = build(accelerator, 0)
train(accelerator, model, optimizer)
accelerator.save_state(sys.argv[1])
print("RESULT", json.dumps(summary(model, optimizer)))
"""

TIED_LOAD = TIED + """
from overdrive import Accelerator
accelerator = Accelerator(cpu=True)
model, optimizer = build(accelerator, 1)  # other initial weights: all must come from the checkpoint
accelerator.load_state(sys.argv[1])
print("RESULT", json.dumps(summary(model, optimizer)))
"""


def test_tied_weights_stored_once_by_accelerate_load(tmp_path):
    saved = _run(TIED_SAVE, str(tmp_path / "ckpt"), "plain")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert "lm_head.weight" not in stored and "wte.weight" in stored  # Accelerate stores the tied weight once
    loaded = _run(TIED_LOAD, str(tmp_path / "ckpt"), "plain")
    assert loaded == saved and loaded["tied"]
