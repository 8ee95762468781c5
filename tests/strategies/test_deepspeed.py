"""DeepSpeed without training processes: the plugin, "auto" filling, conflicts reported together, the
Megatron-LM plugin's checks, the missing-package errors; and one real launch with --use_deepspeed."""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from overdrive import (
    Accelerator,
    DeepSpeedPlugin,
    DistributedType,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    PartialState,
)
from overdrive.strategies.deepspeed.ds_config import engine_config
from tests.support.cli import clean_env, overdrive, rank_results


def _fill(plugin: DeepSpeedPlugin, **overrides):
    values = dict(mixed_precision="no", accumulation_steps=1, micro_batch=4, world_size=2, optimizer_values={},
                  scheduler_values={}, hidden_size=None, cpu=True, client_optimizer=True, training=True)
    values.update(overrides)
    return engine_config(plugin, **values)


def test_plugin_fields_make_accelerates_default_config():
    plugin = DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu", offload_optimizer_device="cpu",
                             zero3_save_16bit_model=True)
    config = _fill(plugin, mixed_precision="bf16", accumulation_steps=2)
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
    config = _fill(plugin, mixed_precision="fp16", accumulation_steps=4, micro_batch=8, hidden_size=64,
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
    without_size = _fill(DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}))
    assert "reduce_bucket_size" not in without_size["zero_optimization"]  # DeepSpeed's default


def test_values_nothing_can_fill_are_named():
    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0,
                                           "optimizer": {"type": "Lamb", "params": {"lr": "auto", "max_coeff": "auto"}}})
    with pytest.raises(ValueError) as info:
        _fill(plugin, micro_batch=None, optimizer_values={"lr": 1e-3})
    text = str(info.value)
    assert "train_micro_batch_size_per_gpu is \"auto\"" in text and "pass the training data loader" in text
    assert "optimizer.params.max_coeff" in text and "optimizer.params.lr" not in text
    inference = _fill(DeepSpeedPlugin(zero_stage=3), micro_batch=None, training=False)
    assert inference["train_micro_batch_size_per_gpu"] == 1  # forward only: bookkeeping


def test_conflicts_are_reported_together_naming_both_values():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
                                           "bf16": {"enabled": True}, "gradient_accumulation_steps": 4,
                                           "gradient_clipping": 1.0},
                             zero_stage=3, gradient_clipping=0.5, offload_optimizer_device="disk")
    with pytest.raises(ValueError) as info:
        Accelerator(deepspeed_plugin=plugin, mixed_precision="fp16", gradient_accumulation_steps=2,
                    fsdp_plugin=FullyShardedDataParallelPlugin())
    text = str(info.value)
    assert "DeepSpeedPlugin(zero_stage=3) conflicts with zero_optimization.stage=2 in the DeepSpeed config dict" in text
    assert "DeepSpeedPlugin(gradient_clipping=0.5) conflicts with gradient_clipping=1.0" in text
    assert "offload_optimizer_device='disk' is not valid; choose from none, cpu, nvme" in text
    assert "offload_param_device='cpu' offloads sharded parameters, which only ZeRO stage 3 has" in text
    assert "mixed_precision='fp16' (Accelerator) conflicts with bf16.enabled=true" in text
    assert "gradient_accumulation_steps=2 (Accelerator) conflicts with gradient_accumulation_steps=4" in text
    assert "DeepSpeed (deepspeed_plugin) and fsdp_plugin were both given" in text
    with pytest.raises(ValueError, match="both given; give one"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(), deepspeed_plugins={"a": DeepSpeedPlugin()})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config="/no/such/ds_config.json")


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


@pytest.mark.requires("deepspeed")
def test_prepare_refuses_what_deepspeed_cannot_build_together():
    import torch
    import torch.distributed as dist

    from overdrive.utils import DummyOptim, DummyScheduler

    assert not dist.is_initialized()  # tests/conftest.py fails a test that leaves one behind
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="prepare\\(\\) got 2 models; DeepSpeed builds one engine per model"):
        acc.prepare(first, second)
    with pytest.raises(ValueError, match="an optimizer or scheduler without its model"):
        acc.prepare(torch.optim.SGD(first.parameters(), lr=0.1))
    dummy = DummyOptim(first.parameters())
    with pytest.raises(ValueError) as info:  # reported before any process group or engine exists
        acc.prepare(first, dummy, DummyScheduler(dummy, total_num_steps=10))
    text = str(info.value)
    assert "DummyOptim stands for the optimizer of the DeepSpeed config, but the config built from the plugin's fields has no" in text
    assert "DummyScheduler stands for the scheduler of the DeepSpeed config" in text
    assert "train_micro_batch_size_per_gpu is \"auto\"" in text
    assert not dist.is_initialized()  # the refusals came before any process group was made
    acc.free_memory()


@pytest.mark.requires("deepspeed")
def test_launch_config_selects_deepspeed(monkeypatch):
    monkeypatch.setenv("OVERDRIVE_LAUNCH_CONFIG", json.dumps({
        "distributed_type": "DEEPSPEED", "mixed_precision": "no", "gradient_accumulation_steps": 2,
        "deepspeed_config": {"zero_stage": "1", "gradient_clipping": "0.25", "deepspeed_multinode_launcher": "pdsh"}}))
    acc = Accelerator()
    plugin = acc.state.deepspeed_plugin
    assert acc.distributed_type == DistributedType.DEEPSPEED and acc.gradient_accumulation_steps == 2
    assert plugin.zero_stage == 1 and plugin.gradient_clipping == 0.25
    with pytest.raises(ValueError, match="unknown keys"):
        DeepSpeedPlugin.from_config_dict({"zero_stages": 2})


def test_missing_packages_are_named(monkeypatch):
    from overdrive.config.deepspeed import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"pip install 'overdrive\[deepspeed\]'"):
        import_deepspeed()
    with pytest.raises(ValueError, match=r"the 'deepspeed' package cannot be imported; install it with"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    monkeypatch.setattr("overdrive.resolve.megatron.megatron_core_problem",
                        lambda: "MegatronLMPlugin needs the 'megatron-core' package (pip install megatron-core)")
    with pytest.raises(ValueError) as info:
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, pp_degree=1))
    assert "megatron_lm_plugin: MegatronLMPlugin needs the 'megatron-core' package" in str(info.value)


class Payload:
    """Stands for an object a hostile checkpoint could carry: unpickling it would run its class's code."""


def test_engine_files_referring_to_unknown_globals_are_refused(tmp_path):
    import torch

    from overdrive.strategies.deepspeed.checkpoint import refuse_unknown_globals

    torch.save({"module": {"w": torch.zeros(2)}, "ds_version": "0.19"}, tmp_path / "mp_rank_00_model_states.pt")
    refuse_unknown_globals(tmp_path)  # tensors, dicts and strings only
    torch.save({"extra": Payload()}, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(PermissionError, match=r"Payload.*allow_pickle=True"):
        refuse_unknown_globals(tmp_path)


def test_megatron_plugin_checks():
    plugin = MegatronLMPlugin(tp_degree=0, pp_degree=2, sequence_parallelism=True, lr_decay_style="step",
                              gradient_clipping=-1, custom_model_provider_function="model")
    problems = plugin.problems(world_size=6)
    text = "\n".join(problems)
    assert "tp_degree=0 is not valid; it must be an integer >= 1" in text
    assert "sequence_parallelism=True splits activations across the tensor-parallel group, which needs tp_degree > 1" in text
    assert "lr_decay_style='step' is not valid" in text and "gradient_clipping=-1 is not valid" in text
    assert "custom_model_provider_function='model' is not callable" in text
    assert MegatronLMPlugin(tp_degree=2, pp_degree=2).problems(world_size=6) == [
        "tp_degree x pp_degree = 2 x 2 = 4 does not divide the 6 processes; the data-parallel degree is the "
        "processes divided by that product"]
    assert MegatronLMPlugin(tp_degree=2, pp_degree=2, sequence_parallelism=True, num_micro_batches=4).problems(8) == []


DS_SCRIPT = """
import json, sys
sys.path.insert(0, EXAMPLES)
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from overdrive import Accelerator, DistributedType
from digits import train_step

acc = Accelerator()
assert acc.distributed_type == DistributedType.DEEPSPEED, acc.distributed_type
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), DataLoader(data, batch_size=4))
losses = []
for _ in range(4):
    for x, y in loader:
        loss = train_step(acc, model, opt, x, y, nn.functional.mse_loss)
        losses.append(acc.gather(loss.detach()[None]).mean().item())
open(f"{sys.argv[1]}/result_{acc.process_index}.json", "w").write(json.dumps({
    "rank": acc.process_index, "world": acc.num_processes, "type": acc.distributed_type.value,
    "stage": model.zero_optimization_stage(), "clip": model.gradient_clipping(),
    "accumulation": model.gradient_accumulation_steps(), "steps": model.global_steps,
    "offload": acc.deepspeed_plugin.get_value("zero_optimization.offload_optimizer.device"),
    "first": sum(losses[:8]) / 8, "last": sum(losses[-8:]) / 8}))
"""


@pytest.mark.requires("deepspeed")
@pytest.mark.deepspeed
@pytest.mark.timeout(180)
def test_use_deepspeed_launch_trains_on_two_processes(tmp_path):
    script = tmp_path / "ds_train.py"
    script.write_text(DS_SCRIPT.replace("EXAMPLES", repr(str(Path(__file__).resolve().parents[2] / "examples"))))
    result = overdrive("launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "2",
                       "--gradient_accumulation_steps", "2", "--gradient_clipping", "0.7",
                       "--offload_optimizer_device", "cpu", "--deepspeed_multinode_launcher", "standard", str(script), str(tmp_path),
                       env=clean_env(tmp_path, DS_LOG_LEVEL="error"), timeout=170)
    for got in rank_results(result, tmp_path):
        assert got["world"] == 2 and got["type"] == "DEEPSPEED" and got["stage"] == 2, got
        assert got["clip"] == 0.7 and got["accumulation"] == 2 and got["offload"] == "cpu", got
        assert got["steps"] == 16 and got["last"] < got["first"], got  # 4 epochs x 8 batches / 2


def test_docs_name_the_benchmark_command():
    text = (Path(__file__).resolve().parents[2] / "docs" / "deepspeed.md").read_text()
    assert "python bench/zero_memory.py" in text
