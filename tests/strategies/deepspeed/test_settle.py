"""DeepSpeed's config settled against the rest of the run (strategies/deepspeed/settle.py): against the
Accelerator's arguments when the plan is made (precision and accumulation taken from the config, the
plan's copies of the plugins), and "auto" values filled from the prepared objects when an engine is built."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping

import pytest

from overdrive import Accelerator, DeepSpeedPlugin, DistributedType, PartialState
from overdrive.strategies.deepspeed.settle import engine_config


def fill(plugin: DeepSpeedPlugin, **overrides):
    values = dict(mixed_precision="no", accumulation_steps=1, micro_batch=4, world_size=2, optimizer_values={},
                  scheduler_values={}, hidden_size=None, cpu=True, client_optimizer=True, training=True)
    values.update(overrides)
    return engine_config(plugin, **values)


def test_plugin_fields_make_accelerates_default_config():
    plugin = DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu", offload_optimizer_device="cpu",
                             zero3_save_16bit_model=True)
    config = fill(plugin, mixed_precision="bf16", accumulation_steps=2)
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["gradient_clipping"] == 1.0  # Accelerate's default when the plugin builds the config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"],
            config["train_batch_size"]) == (4, 2, 16)
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["zero_allow_untested_optimizer"] is True and config["zero_force_ds_cpu_optimizer"] is False
    assert plugin.deepspeed_config["train_batch_size"] == "auto"  # the plugin's own config keeps "auto"


def test_auto_values_are_filled_from_the_prepared_objects(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "fp16": {"enabled": "auto", "loss_scale_window": 100},
        "zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": "auto"}}}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=3, gradient_clipping=0.3)
    assert plugin.get_value("zero_optimization.stage") == 3 and plugin.problems() == []
    config = fill(plugin, mixed_precision="fp16", accumulation_steps=4, micro_batch=8, hidden_size=64,
                   optimizer_values={"lr": 2e-4, "betas": (0.9, 0.95), "weight_decay": 0.1},
                   scheduler_values={"warmup_max_lr": 2e-4, "warmup_num_steps": 10}, client_optimizer=False)
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (8, 8 * 4 * 2)
    assert config["gradient_clipping"] == 0.3 and config["fp16"] == {"enabled": True, "loss_scale_window": 100}
    assert config["optimizer"]["params"] == {"lr": 2e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}
    assert config["scheduler"]["params"] == {"warmup_max_lr": 2e-4, "warmup_num_steps": 10}
    zero = config["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"],
            zero["stage3_param_persistence_threshold"]) == (4096, 3686, 640)
    assert "zero_allow_untested_optimizer" not in config  # the config's own optimizer
    without_size = fill(DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}))
    assert "reduce_bucket_size" not in without_size["zero_optimization"]  # DeepSpeed's default


def test_values_nothing_can_fill_are_named():
    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0,
                                           "optimizer": {"type": "Lamb", "params": {"lr": "auto", "max_coeff": "auto"}}})
    with pytest.raises(ValueError) as info:
        fill(plugin, micro_batch=None, optimizer_values={"lr": 1e-3})
    text = str(info.value)
    assert "train_micro_batch_size_per_gpu is \"auto\"" in text and "pass the training data loader" in text
    assert "optimizer.params.max_coeff" in text and "optimizer.params.lr" not in text
    inference = fill(DeepSpeedPlugin(zero_stage=3), micro_batch=None, training=False)
    assert inference["train_micro_batch_size_per_gpu"] == 1  # forward only: bookkeeping


@pytest.mark.requires("deepspeed")
def test_accelerator_takes_precision_and_accumulation_from_the_config():
    plugins = {"student": DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}, "gradient_accumulation_steps": 3}),
               "teacher": DeepSpeedPlugin(zero_stage=3)}
    acc = Accelerator(deepspeed_plugins=plugins)
    assert acc.distributed_type == DistributedType.DEEPSPEED and acc.strategy.name == "deepspeed"
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 3 and acc.scaler is None
    student, teacher = acc.state.get_deepspeed_plugin("student"), acc.state.get_deepspeed_plugin("teacher")
    assert acc.state.deepspeed_plugin is student and acc.deepspeed_plugin is student
    assert student.get_value("bf16.enabled") is True and teacher.zero_stage_in_use == 3
    acc.state.select_deepspeed_plugin("teacher")
    assert acc.state.deepspeed_plugin is teacher and acc.deepspeed_plugin is teacher
    with pytest.raises(ValueError, match=r"no DeepSpeed plugin is called 'techer'; the plugins are \['student', 'teacher'\]"):
        acc.state.select_deepspeed_plugin("techer")
    from overdrive.utils import DummyOptim, DummyScheduler, get_active_deepspeed_plugin

    assert get_active_deepspeed_plugin(acc.state) is teacher
    assert DummyOptim([], lr=0.1).values() == {"lr": 0.1, "weight_decay": 0}
    assert DummyScheduler(None, total_num_steps=10).total_num_steps == 10
    acc.free_memory()


@pytest.mark.requires("deepspeed")
def test_the_plan_copies_the_plugins_and_selection_leaves_them_untouched():
    """The user's plugin objects are the same after Accelerator() and after selecting another plugin: the
    plan holds copies (read-only), and which plugin is selected is runtime state of the Accelerator."""
    import copy

    plugins = {"student": DeepSpeedPlugin(hf_ds_config={"bfloat16": {"enabled": True}}),
               "teacher": DeepSpeedPlugin(zero_stage=3)}

    def snapshot() -> dict:
        return {name: (copy.deepcopy(p.deepspeed_config), p.selected) for name, p in plugins.items()}

    before = snapshot()
    acc = Accelerator(deepspeed_plugins=plugins)
    assert snapshot() == before  # the resolver renames "bfloat16" to "bf16": in its copy only
    assert "bfloat16" in plugins["student"].deepspeed_config
    assert acc.mixed_precision == "bf16"
    copies = acc.plan.deepspeed.plugins
    assert isinstance(copies, Mapping) and sorted(copies) == ["student", "teacher"]
    assert all(copies[name] is not plugins[name] for name in plugins)
    with pytest.raises(TypeError):
        copies["other"] = DeepSpeedPlugin()  # type: ignore[index]
    acc.state.select_deepspeed_plugin("teacher")
    assert snapshot() == before and acc.deepspeed_plugin is copies["teacher"]
    assert copies["teacher"].selected is False and copies["student"].selected is False  # no flag is flipped
    acc.state.select_deepspeed_plugin()
    assert acc.deepspeed_plugin is copies["student"] and snapshot() == before
    # transformers' Trainer saves its TrainingArguments, which hold the PartialState, with torch.save: the
    # state and its plan pickle (a read-only mappingproxy did not: the Trainer failed at its first save)
    pickle.dumps(PartialState())
    assert sorted(pickle.loads(pickle.dumps(acc.state)).deepspeed_plugins) == ["student", "teacher"]
    acc.free_memory()




def test_the_resolver_calls_the_deepspeed_step_only_for_a_deepspeed_run(monkeypatch):
    """The resolver sits below the strategies: it is handed DeepSpeed's step, calls it only when DeepSpeed
    runs, and names a missing step with the other problems."""
    from overdrive.resolve import resolve_training

    monkeypatch.delenv("OVERDRIVE_LAUNCH_CONFIG", raising=False)
    arguments = dict(mixed_precision=None, gradient_accumulation_steps=1, gradient_accumulation_plugin=None,
                     dataloader_config=None, device_placement=None, step_scheduler_with_optimizer=True, rng_types=None,
                     handlers={}, project_config=None, log_with=None, dynamo_backend=None)
    calls = []

    def step(*args, **kwargs):
        calls.append(args)
        return None

    plan = resolve_training(PartialState().plan, **arguments, deepspeed_step=step)
    assert plan.strategy != "deepspeed" and calls == []
    with pytest.raises(ValueError) as info:
        resolve_training(PartialState().plan, **{**arguments, "rng_types": ["dice"]},
                         deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert "was not given the DeepSpeed strategy's step" in str(info.value) and "dice" in str(info.value)
