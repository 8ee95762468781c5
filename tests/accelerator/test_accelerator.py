"""The Accelerator in one process: precision, accumulation, scheduling, prepare and its errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from overdrive import Accelerator, GradientAccumulationPlugin
from overdrive.config import DataLoaderConfiguration
from overdrive.precision import precision_policy
from tests.accelerator.test_accelerator_distributed import (
    loss_fn,
    make_data,
    make_model,
    overdrive_weights,
    reference_weights,
)


def test_accumulation_over_an_epoch_not_divisible_by_k_equals_large_batches():
    # 10 batches of 4 with k=4: windows of 4, 4 and 2 batches == steps on 16, 16 and 8 samples.
    weights, syncs = overdrive_weights(batch_size=4, n=40, epochs=2, steps=4)
    close_to = reference_weights(make_data(40), [16, 16, 8], epochs=2)
    assert max((a - b).abs().max().item() for a, b in zip(weights, close_to)) < 1e-5
    assert syncs == (([False] * 3 + [True]) * 2 + [False, True]) * 2


def test_fp16_skips_the_step_on_overflow_and_reports_it():
    from overdrive import GradScalerKwargs

    # A modest initial scale: the default 2**16 overflows fp16 gradients of this model by itself.
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256)])
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    x, y = make_data(8)[:]
    before = [p.detach().clone() for p in model.parameters()]
    accelerator.backward(loss_fn(model, x, y) * float("inf"))
    opt.step()
    sched.step()
    assert accelerator.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert sched.get_last_lr() == [0.1]  # the scheduler does not step past a skipped optimizer step
    opt.zero_grad()
    accelerator.backward(loss_fn(model, x, y))
    opt.step()
    sched.step()
    assert not accelerator.optimizer_step_was_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert sched.get_last_lr() == [0.05]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    accelerator.free_memory()


def test_fp16_clipping_unscales_once():
    from overdrive import GradScalerKwargs

    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256)])
    model = make_model()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ref = make_model()
    x, y = make_data(8)[:]
    loss_fn(ref, x, y).backward()
    expected = torch.cat([p.grad.flatten() for p in ref.parameters()]).norm()
    accelerator.backward(loss_fn(model, x, y))
    norm = accelerator.clip_grad_norm_(model.parameters(), 1e9)
    assert abs(norm.item() - expected.item()) / expected.item() < 1e-2  # fp16 forward, true (unscaled) norm
    again = accelerator.clip_grad_norm_(model.parameters(), 1e9)  # a second call must not unscale again
    assert torch.equal(norm, again)
    accelerator.free_memory()


def test_prepare_keeps_order_passes_others_through_and_moves_to_device():
    accelerator = Accelerator()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    loader = DataLoader(make_data(8), batch_size=2)
    other = {"keep": "me"}
    out = accelerator.prepare(sched, other, loader, opt, model)
    assert out[1] is other
    assert out[4] is model  # one process: the model itself, on the device
    assert out[3].optimizer is opt and out[0].scheduler is sched
    assert out[0].optimizers == [out[3]]
    assert len(out[2]) == 4
    assert accelerator.prepare(out[4]) is out[4]  # preparing twice changes nothing
    assert accelerator.unwrap_model(out[4]) is model
    accelerator.free_memory()


def test_scheduler_steps_once_per_window_and_per_process_count():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model, opt, sched, loader = accelerator.prepare(model, opt, sched, DataLoader(make_data(16), batch_size=2))
    lrs = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(loss_fn(model, x, y))
            opt.step()
            sched.step()
            opt.zero_grad()
            lrs.append(sched.get_last_lr()[0])
    assert lrs == [1.0, 1 / 2, 1 / 2, 1 / 3, 1 / 3, 1 / 4, 1 / 4, 1 / 5]
    accelerator.free_memory()


def test_sync_each_batch_and_plugin():
    plugin = GradientAccumulationPlugin(num_steps=3, sync_each_batch=True)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    assert accelerator.gradient_accumulation_steps == 3
    accelerator.free_memory()


def test_precision_on_a_device_without_autocast():
    with pytest.raises(ValueError, match="'fp16' cannot run on meta"):
        precision_policy("fp16", torch.device("meta"))
    assert precision_policy("bf16", torch.device("cpu")).compute_dtype == torch.bfloat16
    assert precision_policy("fp16", torch.device("cpu")).loss_scaling


def test_meta_model_and_unprepared_model_errors():
    accelerator = Accelerator()
    with torch.device("meta"):
        meta = nn.Linear(3, 3)
    with pytest.raises(ValueError, match=r"meta device \(weight, bias\)"):
        accelerator.prepare(meta)
    with pytest.raises(ValueError, match="prepare\\(\\) did not return"):
        with accelerator.accumulate(nn.Linear(2, 2)):
            pass
    accelerator.free_memory()


def test_split_batches_with_an_indivisible_batch_size():
    # One process divides everything; the check itself is the data loader's, shown with two shards.
    from overdrive.data import prepare_data_loader

    with pytest.raises(ValueError, match="5") as info:
        prepare_data_loader(DataLoader(range(10), batch_size=5), num_processes=2, process_index=0,
                            split_batches=True)
    assert "2" in str(info.value)
    assert DataLoaderConfiguration(split_batches=True).split_batches


def test_import_is_light():
    code = ("import sys, torch; before = set(sys.modules); import overdrive; from overdrive import Accelerator; "
            "heavy = [m for m in ('torch._dynamo', 'sympy', 'tensorboard', 'deepspeed', 'transformers', "
            "'mlflow', 'wandb', 'sklearn', 'tqdm') if m in sys.modules and m not in before]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_profile_writes_a_chrome_trace(tmp_path):
    import json

    from overdrive import ProfileKwargs

    accelerator = Accelerator()
    model = accelerator.prepare(make_model())
    with accelerator.profile(ProfileKwargs(output_trace_dir=str(tmp_path), record_shapes=True)):
        model(make_data(4)[:][0])
    trace = json.loads((tmp_path / "trace_rank_0.json").read_text())
    assert any("addmm" in event.get("name", "") for event in trace["traceEvents"])
    accelerator.free_memory()


def test_unknown_tracker_is_reported_with_the_other_errors():
    with pytest.raises(ValueError) as info:
        Accelerator(log_with=["tensorbored"], mixed_precision="fp64")
    assert "tensorbored" in str(info.value) and "fp64" in str(info.value)


def test_prepared_objects_are_marked_as_accelerate_marks_them():
    # libraries (and Accelerate's test_is_accelerator_prepared) read _is_accelerate_prepared
    accelerator = Accelerator()
    model = nn.Linear(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    train, valid = DataLoader(list(range(8)), batch_size=2), DataLoader(list(range(4)), batch_size=2)
    prepared = accelerator.prepare(model, optimizer, scheduler, train, valid, [1, 2, 3])
    assert [getattr(obj, "_is_accelerate_prepared", False) for obj in prepared] == [True] * 5 + [False]


def test_prepare_model_of_a_prepared_model_returns_it_and_registers_it_once():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare_model(nn.Linear(4, 2))
    assert model._is_accelerate_prepared is True
    count = len(accelerator._models)
    assert accelerator.prepare_model(model) is model and accelerator.prepare(model) is model
    assert len(accelerator._models) == count  # Accelerate's rule: a prepared model is never wrapped twice
    accelerator.free_memory()


def test_reading_the_process_state_after_reset_says_why():
    from overdrive import PartialState

    state = PartialState(cpu=True)
    assert state.num_processes == 1
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'someotherthing'"):
        _ = state.someotherthing
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"`PartialState` object has no attribute `num_processes`.*_reset_state\(\)"):
        _ = state.num_processes
    state.someotherthing = "value"  # a new attribute is still an attribute
    assert state.someotherthing == "value"
    PartialState._reset_state()
