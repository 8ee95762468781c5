"""Checkpoints on real gloo process groups: exact resume, other world sizes, a rank killed mid-save.

One reference run (2 processes) trains 30 micro-batches with shuffling, dropout, gradient accumulation
and fp16 loss scaling, saving automatically named checkpoints at steps 6, 10 and 18 (total_limit=2).
The other runs start fresh processes with another seed and compare with it. A last test saves an FSDP2
(sharded) run and loads it sharded at 2 processes and unsharded in one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import random
import shutil
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from overdrive import (
    Accelerator,
    DataLoaderConfiguration,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
)
from overdrive.checkpoint import CheckpointError, merge_weights_main
from tests.support.distributed import _worker, free_port, run_distributed

pytestmark = pytest.mark.slow

N_SAMPLES, BATCH, STEPS = 96, 4, 30
SAVES = (6, 10, 18)


class Tracker:
    """A registered object whose state mixes an int, a tensor and a tuple."""

    def __init__(self) -> None:
        self.calls, self.total, self.last = 0, torch.zeros(2), (0.0, "none")

    def update(self, loss: torch.Tensor) -> None:
        self.calls += 1
        self.total += loss.float()
        self.last = (float(loss), "seen")

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "total": self.total.clone(), "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls, self.total, self.last = state["calls"], state["total"].clone(), state["last"]


@dataclass
class Run:
    acc: Accelerator
    model: nn.Module
    opt: Any
    sched: Any
    loader: Any
    tracker: Tracker


def setup(seed: int, project_dir: str | None = None, **project: Any) -> Run:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=project_dir is not None,
                                  **project)
    # exact_resume: the loader continues mid-epoch where the checkpoint stopped (overdrive's switch; by default,
    # as in Accelerate, the script skips batches itself: tests/compat/test_resume_fidelity.py)
    acc = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=2, project_config=config,
                      dataloader_config=DataLoaderConfiguration(exact_resume=True),
                      kwargs_handlers=[GradScalerKwargs(init_scale=256),
                                       InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    model = nn.Sequential(nn.Linear(6, 32), nn.Dropout(0.3), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.9)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(N_SAMPLES, 6, generator=g), torch.randn(N_SAMPLES, generator=g),
                         torch.arange(N_SAMPLES))
    tracker = Tracker()
    acc.register_for_checkpointing(tracker)
    model, opt, sched, loader = acc.prepare(model, opt, sched, DataLoader(data, batch_size=BATCH, shuffle=True))
    return Run(acc, model, opt, sched, loader, tracker)


def train(run: Run, until: int, on_step: Any = None) -> list[tuple[float, list[int]]]:
    """Train until ``until`` micro-batches in all (``tracker.calls``, restored by ``load_state``: the
    accelerator's ``step`` restarts at each epoch, as Accelerate's does)."""
    records = []
    while run.tracker.calls < until:
        for x, y, idx in run.loader:
            with run.acc.accumulate(run.model):
                loss = nn.functional.mse_loss(run.model(x).squeeze(-1), y)
                run.acc.backward(loss)
                run.opt.step()
                run.sched.step()
                run.opt.zero_grad()
            run.tracker.update(loss.detach())
            records.append((loss.item(), idx.tolist()))
            if on_step is not None:
                on_step(run.tracker.calls)
            if run.tracker.calls >= until:
                break
    return records


def snapshot(run: Run) -> dict[str, Any]:
    return {"model": {k: v.detach().clone() for k, v in run.acc.unwrap_model(run.model).state_dict().items()},
            "opt": _clone(run.opt.state_dict()), "sched": run.sched.state_dict(),
            "scaler": run.acc.scaler.state_dict(), "step": run.acc.step, "rng": torch.get_rng_state(),
            "tracker": _clone(run.tracker.state_dict()), "loader": run.loader.state_dict(),
            "iteration": run.acc.project_configuration.iteration}


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check_restored(run: Run, saved: dict[str, Any], main: dict[str, Any]) -> None:
    """Everything restored as ``saved`` (this rank's snapshot, taken just before the save) or ``main``
    (rank 0's, for what only the main process saves: registered objects)."""
    now = snapshot(run)
    for key in ("model", "opt", "sched", "scaler", "step"):
        assert same(now[key], saved[key]), f"{key} differs after load_state"
    assert now["iteration"] == saved["iteration"] + 1  # a checkpoint holds the next save's number
    assert same(now["tracker"], main["tracker"]), "the registered object differs after load_state"


# -- the spawned functions ------------------------------------------------------------------------
def _reference(root: str) -> dict[str, Any]:
    run = setup(0, project_dir=root, total_limit=2)
    hook_calls: list[tuple[int, int, str]] = []
    handle = run.acc.register_save_state_pre_hook(
        lambda models, weights, out: hook_calls.append((len(models), len(weights), out)))
    snaps: dict[int, Any] = {}

    def on_step(step: int) -> None:
        if step in SAVES:
            snaps[step] = snapshot(run)
            snaps[step]["path"] = run.acc.save_state()
            if step == SAVES[0]:
                handle.remove()

    records = train(run, STEPS, on_step)
    run.acc.save_model(run.model, os.path.join(root, "export"), max_shard_size="1KB")
    return {"records": records, "snaps": snaps, "final": snapshot(run), "hook_calls": hook_calls,
            "listing": sorted(os.listdir(os.path.join(root, "checkpoints"))),
            "full": run.acc.get_state_dict(run.model), "seed": run.loader.state_dict()["seed"]}


def _resume(root: str) -> dict[str, Any]:
    run = setup(99, project_dir=root, total_limit=2)
    newest = run.acc.load_state()  # no folder: the newest complete checkpoint
    # step 18 is 6 micro-batches into epoch 1, and Accelerate's count restarts at each epoch
    found = {"newest": newest, "step": run.acc.step, "iteration": run.acc.project_configuration.iteration}
    run.acc.load_state(os.path.join(root, "checkpoints", "checkpoint_1"))  # step 10, mid-epoch
    records = train(run, STEPS)
    return {"found": found, "records": records, "final": snapshot(run)}


def _kill_during_save(root: str) -> dict[str, Any]:
    rank = int(os.environ["RANK"])
    # Two "machines" with folders of their own: one working directory per rank, a relative project dir.
    node = Path(root) / f"node{rank}"
    node.mkdir()
    os.chdir(node)
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    run = setup(0, project_dir="proj", save_on_each_node=True)
    train(run, 2)
    run.acc.save_state(layout="resharding")  # the DCP layout: each machine keeps its ranks' data files
    node_files = sorted(os.listdir("proj/checkpoints/checkpoint_0"))

    run = setup(0, project_dir=os.path.join(root, "shared"))
    train(run, 6)
    saved = snapshot(run)
    run.acc.save_state()
    train(run, 8)
    if rank == 1:
        from overdrive.checkpoint.writer import ChecksummingWriter

        original = ChecksummingWriter.write_data

        def write_then_die(self: Any, plan: Any, planner: Any) -> Any:
            original(self, plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

        ChecksummingWriter.write_data = write_then_die
    try:
        run.acc.save_state(layout="resharding")  # killed inside DCP's writer
        outcome = "saved"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        outcome = f"{type(exc).__name__}: {exc}"
    return {"node_files": node_files, "saved": saved, "outcome": outcome}


def _other_world_size(train_root: str, kill_root: str, expected: dict[str, Any]) -> dict[str, Any]:
    from overdrive.data import SeedableRandomSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run = setup(7)
    out: dict[str, Any] = {}
    if world == 3:  # step 10 is 80 samples into the epoch: not a whole number of 12-sample global batches
        with pytest.raises(CheckpointError, match="global batch of 12"):
            run.acc.load_state(os.path.join(train_root, "checkpoints", "checkpoint_1"))
        assert run.acc.step == 0  # nothing was changed
    rng_before = torch.get_rng_state()
    run.acc.load_state(os.path.join(train_root, "checkpoints", "checkpoint_2"))  # step 18: epoch 1, 48 samples
    saved = expected["snap18"][min(rank, 1)]
    check_restored(run, saved, expected["snap18"][0])
    rng_after = torch.get_rng_state()
    out["rng_restored"] = torch.equal(rng_after, saved["rng"]) if rank < 2 else torch.equal(rng_after, rng_before)
    order = list(SeedableRandomSampler(range(N_SAMPLES), seed=expected["seed"], epoch=1))
    _, _, idx = next(iter(run.loader))
    out["next_batch_ok"] = idx.tolist() == order[48 + BATCH * rank: 48 + BATCH * (rank + 1)]
    if world == 3:  # the checkpoint of the killed save's project: the previous, complete one is loaded
        run = setup(8, project_dir=os.path.join(kill_root, "shared"))
        out["loaded"] = run.acc.load_state()
        check_restored(run, expected["killed_saved"], expected["killed_saved"])
        out["saved_after"] = run.acc.save_state()
    return out


# -- the tests ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("reference")
    return root, run_distributed(_reference, 2, str(root), timeout=200)


@pytest.mark.timeout(240)
def test_resumed_run_equals_uninterrupted_run_bit_for_bit(reference: tuple[Path, list]) -> None:
    root, ref = reference
    assert ref[0]["listing"] == ["checkpoint_1", "checkpoint_2"]  # total_limit=2 deleted checkpoint_0
    assert [call[:2] for call in ref[0]["hook_calls"]] == [(1, 1)]  # the hook ran once, then was removed
    for snaps in (ref[0]["snaps"], ref[1]["snaps"]):
        assert [Path(snaps[s]["path"]).name for s in SAVES] == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    resumed = run_distributed(_resume, 2, str(root), timeout=200)
    for rank in range(2):
        found = resumed[rank]["found"]
        assert Path(found["newest"]).name == "checkpoint_2" and found["step"] == 6 and found["iteration"] == 3
        start = SAVES[1]
        assert resumed[rank]["records"] == ref[rank]["records"][start:]  # same batches, same losses
        for key in ("model", "opt", "sched", "scaler", "step"):
            assert same(resumed[rank]["final"][key], ref[rank]["final"][key]), key
    # registered objects are saved from the main process (as in Accelerate): every rank resumes with its state
    assert same(resumed[0]["final"]["tracker"], ref[0]["final"]["tracker"])
    assert len({tuple(r["records"][0][1]) for r in resumed}) == 2  # the ranks saw different batches


@pytest.mark.timeout(240)
def test_checkpoint_of_two_processes_loads_at_one(reference: tuple[Path, list], tmp_path: Path) -> None:
    root, ref = reference
    kill_root = tmp_path / "kill"
    kill_root.mkdir()
    expected = {"snap18": [ref[r]["snaps"][18] for r in range(2)], "seed": ref[0]["seed"]}
    results = run_distributed(_other_world_size, 1, str(root), str(kill_root), expected, timeout=200)
    assert results[0] == {"rng_restored": True, "next_batch_ok": True}


@pytest.mark.timeout(240)
def test_rank_killed_mid_save_then_resume_at_three_processes(reference: tuple[Path, list], tmp_path: Path) -> None:
    root, ref = reference
    # run_distributed's fork server (torch imported once): this test needs each process's exit code
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    results: Any = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(_kill_during_save, rank, 2, port, (str(tmp_path),), {}, results,
                                               dict(os.environ)), daemon=True) for rank in range(2)]
    for proc in procs:
        proc.start()
    try:
        rank, ok, value = results.get(timeout=150)
    except queue_module.Empty:
        pytest.fail("rank 0 neither failed nor finished its save after rank 1 was killed")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    assert procs[1].exitcode == -signal.SIGKILL
    import pickle

    assert rank == 0 and ok, value
    result = pickle.loads(value)
    assert result["outcome"] != "saved"
    assert "did not finish" in result["outcome"] and "untouched" in result["outcome"]
    # save_on_each_node on two "machines": each published its own copy with the global files
    for node, own in ((0, "__0_0.distcp"), (1, "__1_0.distcp")):
        files = os.listdir(tmp_path / f"node{node}" / "proj" / "checkpoints" / "checkpoint_0")
        assert {own, ".metadata", "manifest.json", "state.json"} <= set(files)
    checkpoints = tmp_path / "shared" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_0"]  # rank 0 removed the partial one
    # leftovers of unfinished saves are ignored, then cleaned by the next save
    (checkpoints / ".checkpoint_5.tmp-0123abcd").mkdir()
    (checkpoints / ".checkpoint_5.tmp-0123abcd" / "__0_0.distcp").write_bytes(b"partial")
    for path in (checkpoints / ".checkpoint_5.tmp-0123abcd" / "__0_0.distcp", checkpoints / ".checkpoint_5.tmp-0123abcd"):
        os.utime(path, (0, 0))  # left long ago, no owner: provably stale (a fresh one may be another save's)
    (checkpoints / "checkpoint_7").mkdir()  # no manifest: not a complete checkpoint

    expected = {"snap18": [ref[r]["snaps"][18] for r in range(2)], "seed": ref[0]["seed"],
                "killed_saved": result["saved"]}
    out = run_distributed(_other_world_size, 3, str(root), str(tmp_path), expected, timeout=220)
    for rank, result3 in enumerate(out):
        assert result3["rng_restored"] and result3["next_batch_ok"], (rank, result3)
        assert Path(result3["loaded"]).name == "checkpoint_0"
        assert Path(result3["saved_after"]).name == "checkpoint_1"
    assert not (checkpoints / ".checkpoint_5.tmp-0123abcd").exists()
    assert (checkpoints / "checkpoint_7").exists()


@pytest.mark.timeout(120)
def test_missing_rank_file_and_merge_weights(reference: tuple[Path, list], tmp_path: Path) -> None:
    root, ref = reference
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root / "checkpoints" / "checkpoint_2", ckpt)
    out = tmp_path / "merged"
    assert merge_weights_main([str(ckpt), str(out), "--max-shard-size", "1KB"]) == 0
    from safetensors.torch import load_file

    merged = {}
    for file in sorted(out.glob("model-*.safetensors")):
        merged.update(load_file(file))
    assert len(list(out.glob("model-*.safetensors"))) > 1 and (out / "model.safetensors.index.json").exists()
    assert same(merged, ref[0]["snaps"][18]["model"])
    plain = nn.Sequential(nn.Linear(6, 32), nn.Dropout(0.3), nn.Tanh(), nn.Linear(32, 1))
    plain.load_state_dict(merged)
    # the export written by save_model at the end of the reference run
    exported = {}
    for file in sorted((root / "export").glob("model-*.safetensors")):
        exported.update(load_file(file))
    assert same(exported, ref[0]["final"]["model"]) and same(ref[0]["full"], ref[0]["final"]["model"])

    (ckpt / "rank_1.json").unlink()
    with pytest.raises(CheckpointError, match=r"rank_1\.json is missing \(written by rank 1 of 2\)"):
        Accelerator().load_state(ckpt)
    assert merge_weights_main([str(ckpt), str(tmp_path / "other")]) == 1


# -- FSDP2: sharded weights and optimizer state -----------------------------------------------------
def _fsdp_setup(seed: int, sharded: bool = True) -> tuple[Accelerator, nn.Module, Any]:
    from overdrive.config import FullyShardedDataParallelPlugin

    torch.manual_seed(seed)
    acc = (Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=100)) if sharded
           else Accelerator())
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    return acc, model, opt


def _fsdp_steps(acc: Accelerator, model: nn.Module, opt: Any, count: int) -> list[float]:
    g = torch.Generator().manual_seed(acc.step + 100 * acc.process_index)
    losses = []
    for _ in range(count):
        with acc.accumulate(model):
            loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def _fsdp_save_and_resume(root: str) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    acc, model, opt = _fsdp_setup(0)
    _fsdp_steps(acc, model, opt, 3)
    acc.save_state(os.path.join(root, "ckpt"))
    full = acc.get_state_dict(model)
    acc.save_model(model, os.path.join(root, "export"))
    acc2, model2, opt2 = _fsdp_setup(5)
    acc2.load_state(os.path.join(root, "ckpt"))
    return {"sharded": all(isinstance(p, DTensor) for p in model.parameters()),
            "same_after": _fsdp_steps(acc, model, opt, 3) == _fsdp_steps(acc2, model2, opt2, 3),
            "full": full}


@pytest.mark.timeout(240)
def test_fsdp2_checkpoint_resumes_and_loads_unsharded(tmp_path: Path) -> None:
    results = run_distributed(_fsdp_save_and_resume, 2, str(tmp_path), timeout=200)
    assert all(r["sharded"] and r["same_after"] for r in results)
    full = results[0]["full"]
    assert set(full) == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
    acc, model, _ = _fsdp_setup(3, sharded=False)  # one process, a plain model: 2 -> 1
    acc.load_state(tmp_path / "ckpt")
    assert same({k: v.detach() for k, v in model.state_dict().items()}, full)
    from safetensors.torch import load_file

    assert same(load_file(tmp_path / "export" / "model.safetensors"), full)
    assert merge_weights_main([str(tmp_path / "ckpt"), str(tmp_path / "merged")]) == 0
    assert same(load_file(tmp_path / "merged" / "model.safetensors"), full)
