"""DeepSpeed on real gloo process groups (2 CPU ranks): each ZeRO stage follows the one-process loss
trajectory; bf16, optimizer offload, accumulation, a JSON config with "auto" values; save_state /
load_state resume; ZeRO-3 save_model; two models with two plugins.

Each spawned group runs many checks (a spawn costs ~10 s of imports). The reference is plain torch in the
same process, stepping on the global batch that every rank's batch makes (gathered), so it sees exactly
the samples DeepSpeed saw.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from digits import train_step
from tests.support.distributed import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]  # minutes on 2 cores

#: fp32: ZeRO 0-3 agree with the reference to float rounding (measured <= 3e-7); bf16 weights and
#: activations: to bf16 precision (measured <= 3.4e-3 on losses ~1).
FP32_TOLERANCE, BF16_TOLERANCE = 1e-5, 2e-2
CLIP = 0.5
ENV = {"DS_LOG_LEVEL": "error"}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))


def _plugin(**fields: Any) -> Any:
    """A plugin whose ZeRO-3 partitions even these small parameters (by default it keeps whole those under
    100k elements)."""
    from overdrive import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(**fields)
    if fields.get("zero_stage") == 3:
        plugin.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return plugin


def _trajectory(plugin: dict[str, Any], accumulation: int = 1, mixed_precision: str | None = None) -> dict[str, Any]:
    from overdrive import Accelerator

    acc = Accelerator(deepspeed_plugin=_plugin(gradient_clipping=CLIP, **plugin),
                      gradient_accumulation_steps=accumulation, mixed_precision=mixed_precision)
    model = _model()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01)
    model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01),
                                     DataLoader(_dataset(), batch_size=4))
    losses, ref_losses, norms, window = [], [], [], []
    for x, y in loader:
        loss = train_step(acc, model, opt, x, y, nn.functional.mse_loss)
        gx, gy = acc.gather((x, y))
        losses.append(acc.gather(loss.detach()[None]).mean().item())
        with torch.no_grad():
            ref_losses.append(nn.functional.mse_loss(reference(gx), gy).item())
        window.append((gx, gy))
        if acc.sync_gradients:
            ref_loss = sum(nn.functional.mse_loss(reference(wx), wy) for wx, wy in window) / len(window)
            ref_loss.backward()
            ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
            ref_opt.step()
            ref_opt.zero_grad()
            norms.append((acc.clip_grad_norm_(model.parameters(), CLIP).item(), ref_norm.item()))
            window = []
    return {"losses": losses, "reference": ref_losses, "norms": norms, "type": acc.distributed_type.value,
            "stage": model.zero_optimization_stage(), "dtype": str(next(model.module.parameters()).dtype),
            "optimizer": type(opt.optimizer).__name__, "wrapped_once": _wrapped_once(opt)}


def _wrapped_once(opt: Any) -> bool:
    """prepare() returns DeepSpeed's optimizer prepared once, not a prepared optimizer around a wrapper."""
    from overdrive.training.optimizer import AcceleratedOptimizer

    return isinstance(opt, AcceleratedOptimizer) and not isinstance(opt.optimizer, AcceleratedOptimizer)


def _auto_config(folder: str) -> dict[str, Any]:
    """A JSON config whose batch sizes, accumulation, clipping, precision, optimizer and scheduler values
    are "auto", once filled from a torch optimizer and once from DummyOptim / DummyScheduler."""
    from overdrive import Accelerator, DeepSpeedPlugin
    from overdrive.utils import DummyOptim, DummyScheduler

    config = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    }
    path = Path(folder) / f"ds_config_{os.environ['RANK']}.json"
    path.write_text(json.dumps(config))
    out: dict[str, Any] = {}
    for kind in ("torch", "dummy"):
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=0.25),
                          gradient_accumulation_steps=2, mixed_precision="bf16")
        model = _model()
        if kind == "torch":
            opt: Any = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.05)
            sched: Any = DummyScheduler(opt, total_num_steps=40, warmup_num_steps=3)
        else:
            opt = DummyOptim(model.parameters(), lr=2e-3, weight_decay=0.02, betas=(0.7, 0.9), eps=1e-6)
            sched = DummyScheduler(opt, total_num_steps=40, warmup_num_steps=5)
        model, opt, sched, loader = acc.prepare(model, opt, sched, DataLoader(_dataset(), batch_size=4))
        losses = []
        for _ in range(3):
            for x, y in loader:
                losses.append(train_step(acc, model, opt, x, y, nn.functional.mse_loss, scheduler=sched).item())
        group = opt.optimizer.param_groups[0]
        out[kind] = {"micro": model.train_micro_batch_size_per_gpu(), "total": model.train_batch_size(),
                     "accumulation": model.gradient_accumulation_steps(), "clip": model.gradient_clipping(),
                     "bf16": model.bfloat16_enabled(), "betas": tuple(group["betas"]), "eps": group["eps"],
                     "weight_decay": group["weight_decay"], "scheduler": type(model.lr_scheduler).__name__,
                     "warmup": model.lr_scheduler.warmup_num_steps, "total_steps": model.lr_scheduler.total_num_steps,
                     "max_lr": model.lr_scheduler.max_lrs[0], "optimizer": type(model.basic_optimizer).__name__,
                     "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4, "global_steps": model.global_steps}
    return out


def _trajectories(folder: str) -> dict[str, Any]:
    cases = {
        "zero0": ({"zero_stage": 0}, 1, None),
        "zero1": ({"zero_stage": 1}, 1, None),
        "zero2_accumulation": ({"zero_stage": 2}, 2, None),
        "zero3": ({"zero_stage": 3}, 1, None),
        "zero2_bf16": ({"zero_stage": 2}, 1, "bf16"),
        "zero3_bf16_accumulation": ({"zero_stage": 3}, 2, "bf16"),
        "zero2_offload": ({"zero_stage": 2, "offload_optimizer_device": "cpu"}, 1, None),
        "zero3_offload": ({"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"}, 1, None),
    }
    results = {name: _trajectory(*case) for name, case in cases.items()}
    results["auto"] = _auto_config(folder)
    return results


@pytest.mark.timeout(300)
def test_zero_stages_follow_the_one_process_trajectory(tmp_path: Path) -> None:
    results = run_distributed(_trajectories, 2, str(tmp_path), timeout=280, env=ENV)
    assert results[0] == results[1] or all(
        results[0][k]["losses"] == results[1][k]["losses"] for k in results[0] if k != "auto")
    out = results[0]
    for name, result in out.items():
        if name == "auto":
            continue
        tolerance = BF16_TOLERANCE if "bf16" in name else FP32_TOLERANCE
        assert result["type"] == "DEEPSPEED" and result["wrapped_once"], name
        assert len(result["losses"]) == 8, name
        gaps = [abs(a - b) for a, b in zip(result["losses"], result["reference"])]
        assert max(gaps) <= tolerance, (name, gaps)
        for norm, ref_norm in result["norms"]:  # the engine's norm, before it clipped to CLIP
            assert abs(norm - ref_norm) <= tolerance * max(1.0, ref_norm) * 10, (name, result["norms"])
        print(name, "max loss gap", max(gaps), "max norm gap", max(abs(a - b) for a, b in result["norms"]))
    assert out["zero3"]["stage"] == 3 and out["zero0"]["stage"] == 0
    assert out["zero2_bf16"]["dtype"] == "torch.bfloat16" and out["zero2_offload"]["dtype"] == "torch.float32"
    assert out["zero0"]["optimizer"] == "AdamW"
    auto = out["auto"]
    for kind in ("torch", "dummy"):
        got = auto[kind]
        assert (got["micro"], got["total"], got["accumulation"]) == (4, 4 * 2 * 2, 2), got
        assert got["clip"] == 0.25 and got["bf16"] is True and got["optimizer"] == "AdamW", got
        assert got["scheduler"] == "WarmupDecayLR" and got["total_steps"] == 20, got  # 40 one-process steps / 2
        assert got["global_steps"] == 12 and got["last"] < got["first"], got  # 3 epochs x 8 batches / 2
    assert auto["torch"]["betas"] == (0.8, 0.95) and auto["torch"]["eps"] == 1e-7
    assert auto["torch"]["weight_decay"] == 0.05 and auto["torch"]["max_lr"] == 3e-3 and auto["torch"]["warmup"] == 3
    assert auto["dummy"]["betas"] == (0.7, 0.9) and auto["dummy"]["eps"] == 1e-6
    assert auto["dummy"]["weight_decay"] == 0.02 and auto["dummy"]["max_lr"] == 2e-3 and auto["dummy"]["warmup"] == 5


# -- checkpoints, full weights, several models --------------------------------------------------------------
def _resume_setup(seed: int, stage: int) -> tuple[Any, nn.Module, Any, Any]:
    from overdrive import Accelerator

    acc = Accelerator(deepspeed_plugin=_plugin(zero_stage=stage, gradient_clipping=CLIP),
                      gradient_accumulation_steps=2, mixed_precision="bf16" if stage == 2 else None)
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    model, opt, sched, _ = acc.prepare(model, opt, sched, DataLoader(_dataset(), batch_size=4))
    return acc, model, opt, sched


def _steps(acc: Any, model: nn.Module, opt: Any, sched: Any, count: int) -> list[float]:
    g = torch.Generator().manual_seed(acc.step + 100 * acc.process_index)
    losses = []
    for _ in range(count):
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(torch.randn(4, 8, generator=g)), torch.randn(4, 1, generator=g))
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def _checkpoints_and_models(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in (2, 3):  # ZeRO-2 in bf16, ZeRO-3 in fp32
        acc, model, opt, sched = _resume_setup(0, stage)
        _steps(acc, model, opt, sched, 4)
        folder = acc.save_state(os.path.join(root, f"zero{stage}"))
        acc2, model2, opt2, sched2 = _resume_setup(7, stage)  # other weights, until load_state
        acc2.load_state(folder)
        out[f"zero{stage}"] = {"uninterrupted": _steps(acc, model, opt, sched, 6),
                               "resumed": _steps(acc2, model2, opt2, sched2, 6),
                               "lr": (sched.get_last_lr(), sched2.get_last_lr()),
                               "files": sorted(p.name for p in Path(folder, "pytorch_model").iterdir()),
                               "manifest": sorted(json.loads(Path(folder, "manifest.json").read_text())["files"])}
        if stage == 3:
            shards = [(p.data.numel(), p.ds_tensor.numel(), p.ds_numel) for p in model.module.parameters()]
            acc.save_model(model, os.path.join(root, "export"))
            state = acc.get_state_dict(model)
            probe = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                out["zero3_export"] = {"keys": sorted(state), "output": model(probe), "shards": shards}
    out["plugins"] = _two_plugins()
    out["zero3_init"] = _zero3_init()
    return out


def _zero3_init() -> dict[str, Any]:
    """zero3_init_flag: a model built inside zero3_init_context_manager() is sharded as it is created."""
    from overdrive import Accelerator

    plugin = _plugin(zero_stage=3, zero3_init_flag=True, gradient_clipping=CLIP)
    acc = Accelerator(deepspeed_plugin=plugin)
    with plugin.zero3_init_context_manager():
        model = _model(0)
    born_sharded = all(p.data.numel() == 0 for p in model.parameters())
    model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                     DataLoader(_dataset(), batch_size=4))
    losses = []
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        losses.append(loss.item())
    return {"enabled": plugin.is_zero3_init_enabled(), "born_sharded": born_sharded, "losses": losses}


def _two_plugins() -> dict[str, Any]:
    """A student trained with ZeRO-2 while a ZeRO-3 teacher runs forward only (knowledge distillation)."""
    from overdrive import Accelerator, DeepSpeedPlugin

    plugins = {"student": DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0),
               "teacher": DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3},
                                                        "train_micro_batch_size_per_gpu": "auto"})}
    acc = Accelerator(deepspeed_plugins=plugins)
    selected = [acc.state.deepspeed_plugin is acc.state.get_deepspeed_plugin("student")]
    student, teacher = _model(1), _model(2)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student, opt, loader = acc.prepare(student, torch.optim.AdamW(student.parameters(), lr=1e-2),
                                       DataLoader(_dataset(), batch_size=4))
    acc.state.select_deepspeed_plugin("teacher")
    selected.append(acc.deepspeed_plugin is acc.state.get_deepspeed_plugin("teacher"))
    teacher = acc.prepare(teacher)
    teacher.eval()
    losses = []
    for _ in range(4):
        for x, _y in loader:
            with torch.no_grad():
                target = teacher(x)
            loss = nn.functional.mse_loss(student(x), target)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(acc.gather(loss.detach()[None]).mean().item())
    teacher_after = acc.get_state_dict(teacher)
    return {"selected": selected, "stages": (student.zero_optimization_stage(), teacher.zero_optimization_stage()),
            "teacher_unchanged": not teacher_after or all(torch.equal(teacher_after[k], v)
                                                          for k, v in teacher_before.items()),
            "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4}


@pytest.mark.timeout(300)
def test_resume_zero3_export_and_two_plugins(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    results = run_distributed(_checkpoints_and_models, 2, str(tmp_path), timeout=280, env=ENV)
    for rank in results:
        for stage in ("zero2", "zero3"):
            got = rank[stage]
            assert got["resumed"] == got["uninterrupted"], (stage, got)  # bit for bit
            assert got["lr"][0] == got["lr"][1], got["lr"]
            assert "mp_rank_00_model_states.pt" in got["files"] or "zero_pp_rank_0_mp_rank_00_model_states.pt" in got["files"]
            assert any(name.startswith("pytorch_model/") and "optim_states" in name for name in got["manifest"])  # Accelerate's place
    export = results[0]["zero3_export"]
    # ZeRO-3: outside forward a rank holds half of each parameter, nothing of the whole
    assert all(whole == 0 and part == (total + 1) // 2 for whole, part, total in export["shards"]), export["shards"]
    weights = load_file(tmp_path / "export" / "model.safetensors")
    assert sorted(weights) == export["keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    plain = _model(5)
    plain.load_state_dict(weights)
    probe = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(plain(probe), export["output"], atol=1e-6)
    assert results[1]["zero3_export"]["keys"] == []  # gathered to rank 0 only
    plugins = results[0]["plugins"]
    assert plugins["selected"] == [True, True] and plugins["stages"] == (2, 3)
    assert plugins["teacher_unchanged"] and plugins["last"] < plugins["first"], plugins
    init = results[0]["zero3_init"]
    assert init["enabled"] and init["born_sharded"] and len(init["losses"]) == 8, init
    assert all(loss == loss for loss in init["losses"]), init  # finite (no NaN)
