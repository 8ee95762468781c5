"""Checkpoints cross both ways between overdrive and the REAL Accelerate 1.16.0, each in its own process:
overdrive's default ``save_state`` folder loads in Accelerate's ``load_state``, and Accelerate's folder loads in
overdrive's, with DDP (1 and 2 gloo processes), FSDP2 on the CPU (2 processes) and DeepSpeed ZeRO-2, saved in
the middle of an accumulation window with a registered object: the weights, the optimizer's moments, the
scheduler, the step count, the registered object and every process's RNG streams (torch, Python, NumPy) come
back equal. overdrive's own load of its folder is checked the same way.

Accelerate 1.16.0 turns FSDP on for accelerators only and, with DeepSpeed on the CPU, counts one process
(each rank writes ``random_states_0.pkl``): its FSDP2 run here sets its state's distributed type to FSDP
after construction, and its DeepSpeed runs use one process.

Every run is a new process group forked from the tests' fork server (tests/support/distributed.py: torch is
imported there once; Accelerate, overdrive and DeepSpeed are imported fresh in each rank), with the variables
torchrun gives a rank (none on an unlaunched one-process run) and no ``ACCELERATE_*`` variable.
"""

from __future__ import annotations

import os
import runpy
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.distributed import run_distributed

pytestmark = [pytest.mark.requires("accelerate")]
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                    "MASTER_PORT")

SCRIPT = """
import json, os, random, sys
import numpy as np, torch
from torch.utils.data import DataLoader, TensorDataset
folder, framework, mode, strategy = sys.argv[1:5]
if framework == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
else:
    from overdrive import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
class Counter:
    def __init__(self): self.count = 0
    def state_dict(self): return {"count": self.count}
    def load_state_dict(self, state): self.count = state["count"]
kwargs = {"cpu": True, "gradient_accumulation_steps": 2}
if strategy == "fsdp2":
    kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
elif strategy == "zero2":
    del kwargs["cpu"]
    kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config={
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
        "train_batch_size": 4 * 2 * int(os.environ.get("WORLD_SIZE", "1")), "zero_optimization": {"stage": 2}})
accelerator = Accelerator(**kwargs)
if strategy == "fsdp2" and framework == "accelerate":  # its Accelerator turns FSDP on for accelerators only
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = kwargs["fsdp_plugin"]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
counter = Counter()
accelerator.register_for_checkpointing(counter)
model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, DataLoader(data, batch_size=4))
rank = accelerator.process_index
if mode == "save":
    torch.manual_seed(1 + rank); random.seed(2 + rank); np.random.seed(3 + rank)  # each rank's own streams
    for i, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y) + 0 * torch.rand(1).sum()
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
        counter.count += 1
        if i == 2:  # 3 micro-batches, 2 to a window: in the middle of the second window
            break
    accelerator.save_state(folder)
else:
    accelerator.load_state(folder)
def full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().flatten().tolist()
engine_optimizer = getattr(model, "optimizer", None)  # a DeepSpeed engine's ZeRO optimizer
base = engine_optimizer.optimizer if engine_optimizer is not None else getattr(optimizer, "optimizer", optimizer)
row = {"rank": rank, "params": [full(p) for p in model.parameters()],
       "exp_avg": [full(s["exp_avg"]) for s in base.state.values()],
       "lr": scheduler.get_last_lr(), "last_epoch": getattr(scheduler, "scheduler", scheduler).last_epoch,
       "count": counter.count, "step": accelerator.step, "rand": torch.rand(3).tolist(), "py": random.random(),
       "np": float(np.random.rand())}
"""


def _rank(script: str, folder: str, framework: str, mode: str, strategy: str, env: dict[str, str],
          launched: bool) -> dict:
    """One rank of SCRIPT: the test's environment (with the launch variables of tests/support/distributed.py
    when ``launched``); its summary."""
    launch = {key: os.environ[key] for key in LAUNCH_VARIABLES} if launched else {}
    os.environ.clear()
    os.environ.update(env, **launch)
    sys.argv = [script, folder, framework, mode, strategy]
    return runpy.run_path(script, run_name="__main__")["row"]


def _run(folder: Path, processes: int, framework: str, mode: str, strategy: str, launcher: bool = False) -> list[dict]:
    """Each rank's summary after ``mode`` ("save" or "load") of ``folder`` under ``framework``, in rank order."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_LOG_LEVEL": "error"}
    for key in [k for k in env if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "ACCELERATE_"))]:
        env.pop(key)
    script = folder.parent / "script.py"  # written once by _both_ways: runs read it at the same time
    try:
        return run_distributed(_rank, processes, str(script), str(folder), framework, mode, strategy, env,
                               processes > 1 or launcher, timeout=300)
    except (AssertionError, TimeoutError) as error:
        raise AssertionError(f"{framework} {mode} ({strategy}, {processes} processes): {error}") from error


def _at_once(*runs: tuple) -> list[list[dict]]:
    """Independent ``_run`` argument tuples run at the same time (each its own process group): a run is mostly
    each rank importing Accelerate or overdrive, seconds of one core; their results, in order."""
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: _run(*run), runs))


def _both_ways(tmp_path: Path, processes: int, strategy: str, launcher: bool = False) -> set[str]:
    """overdrive saves -> Accelerate and overdrive load; Accelerate saves -> overdrive loads (the two saves at
    once, then the three loads). Returns the names in overdrive's folder."""
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    ours, theirs = tmp_path / "overdrive_ckpt", tmp_path / "accelerate_ckpt"
    saved, saved_theirs = _at_once((ours, processes, "overdrive", "save", strategy, launcher),
                                   (theirs, processes, "accelerate", "save", strategy, launcher))
    assert saved[0]["step"] > 0 and saved[0]["count"] == 3
    loads = _at_once((ours, processes, "accelerate", "load", strategy, launcher),
                     (ours, processes, "overdrive", "load", strategy, launcher),
                     (theirs, processes, "overdrive", "load", strategy, launcher))
    assert loads[0] == saved and loads[1] == saved
    assert loads[2] == saved_theirs
    return set(os.listdir(ours))


ACCELERATE_FILES = {"scheduler.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl"}
EXTRAS = {"manifest.json", "state.json", "rank_0.json"}  # overdrive's, beside Accelerate's; nothing else


def test_ddp_one_process_both_ways(tmp_path):
    names = _both_ways(tmp_path, 1, "ddp")
    assert names == {"model.safetensors", "optimizer.bin", *ACCELERATE_FILES, *EXTRAS}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_two_processes_both_ways(tmp_path):
    names = _both_ways(tmp_path, 2, "ddp")
    assert names == {"model.safetensors", "optimizer.bin", "random_states_1.pkl", "rank_1.json", *ACCELERATE_FILES,
                     *EXTRAS}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp2_two_processes_both_ways(tmp_path):
    names = _both_ways(tmp_path, 2, "fsdp2")
    assert names == {"pytorch_model_fsdp_0", "optimizer_0", "random_states_1.pkl", "rank_1.json", *ACCELERATE_FILES,
                     *EXTRAS}  # Accelerate's SHARDED_STATE_DICT folders, as its FSDP2 default writes them
    for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(os.listdir(tmp_path / "overdrive_ckpt" / sub)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_zero2_both_ways(tmp_path):
    names = _both_ways(tmp_path, 1, "zero2", launcher=True)
    # the engine's own checkpoint where Accelerate has it write it; no model or optimizer file beside it
    assert {"pytorch_model", "latest", *ACCELERATE_FILES, *EXTRAS} <= names
    assert not names & {"model.safetensors", "optimizer.bin", "deepspeed"}
