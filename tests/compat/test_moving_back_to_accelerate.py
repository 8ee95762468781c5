"""save_state(accelerate_layout=True) on 1 process and on 2 gloo processes (DDP): the REAL Accelerate's
load_state reads the folder and restores exactly the weights, Adam moments, LR schedule, registered object,
step and RNG streams (torch, Python, NumPy) that overdrive saved; overdrive's own load_state still reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.requires("accelerate")]
SRC = str(Path(__file__).resolve().parents[2] / "src")

COMMON = """
import json, os, random, sys
import numpy as np, torch
from torch.utils.data import DataLoader, TensorDataset
class Counter:
    def __init__(self): self.count = 0
    def state_dict(self): return {"count": self.count}
    def load_state_dict(self, state): self.count = state["count"]
def build(accelerator):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return (*accelerator.prepare(model, optimizer, scheduler, DataLoader(data, batch_size=4)), counter)
def summary(accelerator, model, optimizer, scheduler, counter):
    state = optimizer.state_dict()["state"]
    return {"rank": accelerator.process_index, "params": [p.detach().flatten().tolist() for p in model.parameters()],
            "exp_avg": [state[i]["exp_avg"].flatten().tolist() for i in sorted(state)],
            "lr": scheduler.get_last_lr(), "last_epoch": scheduler.scheduler.last_epoch, "count": counter.count,
            "step": accelerator.step, "rand": torch.rand(3).tolist(), "py": random.random(),
            "np": float(np.random.rand())}
def report(accelerator, *objects):  # a file per rank: under torchrun the ranks' print() writes interleave
    row = summary(accelerator, *objects)
    with open(os.path.join(os.environ["RESULTS"], f"rank{row['rank']}.json"), "w") as f:
        json.dump(row, f)
"""

SAVE = COMMON + """
from overdrive import Accelerator
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
model, optimizer, scheduler, loader, counter = build(accelerator)
torch.manual_seed(1 + accelerator.process_index)  # each rank's own streams
random.seed(2 + accelerator.process_index); np.random.seed(3 + accelerator.process_index)
for i, (x, y) in enumerate(loader):
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y) + 0 * torch.rand(1).sum())
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
    counter.count += 1
    if i == 2:
        break
accelerator.save_state(sys.argv[1], accelerate_layout=True)
report(accelerator, model, optimizer, scheduler, counter)
"""

LOAD = COMMON + """
if sys.argv[2] == "accelerate":
    from accelerate import Accelerator
else:
    from overdrive import Accelerator
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
model, optimizer, scheduler, loader, counter = build(accelerator)
accelerator.load_state(sys.argv[1])
report(accelerator, model, optimizer, scheduler, counter)
"""


def _run(code: str, processes: int, *args: str) -> list[dict]:
    """Each rank's summary, in rank order, read from the file it wrote. A line each on the shared stdout broke
    up: with PYTHONUNBUFFERED=1 (set on this machine and CI's) ``print`` writes its pieces one by one, and
    rank 0's ``RESULT`` landed before rank 1's whole line (CI saw one rank; 1 run in 40 at load 4-7)."""
    results = Path(tempfile.mkdtemp(dir=Path(args[0]).parent))
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "RESULTS": str(results)}
    for key in [k for k in env if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "ACCELERATE_"))]:
        env.pop(key)
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--standalone",
                                          f"--nproc_per_node={processes}"]
    if processes > 1:  # the CPU setting: without it each process would train alone, under either engine
        env["ACCELERATE_USE_CPU"] = "true"
    script = Path(args[0]).parent / f"script_{abs(hash(code))}.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run([sys.executable, *launcher, str(script), *args], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(results)) == [f"rank{rank}.json" for rank in range(processes)], proc.stdout[-3000:]
    return [json.loads((results / f"rank{rank}.json").read_text()) for rank in range(processes)]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_the_real_accelerate_loads_what_overdrive_saved(tmp_path, processes):
    folder = str(tmp_path / "ckpt")
    saved = _run(SAVE, processes, folder)
    assert len(saved) == processes and saved[0]["step"] > 0
    names = set(os.listdir(folder))
    expected = {"model.safetensors", "optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl",
                *(f"random_states_{rank}.pkl" for rank in range(processes))}
    assert expected <= names and "manifest.json" in names  # Accelerate's files beside overdrive's own
    assert _run(LOAD, processes, folder, "accelerate") == saved
    if processes == 1:  # overdrive's own reading of its folders on 2 processes: tests/checkpoint
        assert _run(LOAD, processes, folder, "overdrive") == saved


def _save_sharded(folder: str) -> tuple[str, list[str]]:
    """On each of 2 gloo ranks: an FSDP2 run asked for Accelerate's layout; the refusal and the folder after it."""
    import torch

    from overdrive import Accelerator
    from overdrive.checkpoint.errors import CheckpointError
    from overdrive.config import FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=10))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(4, 8)).pow(2).mean())
    optimizer.step()
    try:
        accelerator.save_state(folder, accelerate_layout=True)
        refusal = "saved"
    except CheckpointError as exc:
        refusal = str(exc)
    accelerator.wait_for_everyone()
    return refusal, sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.mark.timeout(240)
def test_a_sharded_run_is_refused_before_anything_is_written(tmp_path):
    from tests.support.distributed import run_distributed

    folder = str(tmp_path / "ckpt")
    results = run_distributed(_save_sharded, 2, folder, timeout=200)
    for refusal, written in results:  # every rank refuses alike, and nothing was written
        assert "one-process or DDP run only" in refusal and "FSDP2" in refusal, refusal
        assert written == [], written
