"""Accelerate's DeepSpeed and FSDP launch flags: how they map into the config the workers get (no processes),
their errors, and a real launch with --use_fsdp whose workers check the FSDP2 strategy and its options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from overdrive.cli import Parser, UsageError
from overdrive.cli.launch import add_launch_flags, plan_launch
from tests.support.cli import clean_env, overdrive, rank_results


def _worker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, config: dict | None = None) -> dict:
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    argv = list(flags)
    if config is not None:
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        argv = ["--config_file", str(tmp_path / "c.yaml"), *argv]
    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    plan, _, _ = plan_launch(parser.parse_args([*argv, str(script)]))
    return plan.worker_config


def test_deepspeed_flags_reach_the_worker_config(tmp_path, monkeypatch):
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": "auto"}}))
    got = _worker_config(tmp_path, monkeypatch, "--use_deepspeed", "--zero-stage", "3", "--offload_optimizer_device",
                         "cpu", "--offload-param-device", "cpu", "--gradient_clipping", "0.5", "--zero3_init_flag",
                         "--zero3_save_16bit_model", "false", "--deepspeed_config_file", str(ds_json),
                         "--deepspeed_multinode_launcher", "standard", "--num_processes", "2")
    assert got["distributed_type"] == "DEEPSPEED"
    assert got["deepspeed_config"] == {
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu", "gradient_clipping": 0.5,
        "zero3_init_flag": True, "zero3_save_16bit_model": False, "deepspeed_config_file": str(ds_json),
        "deepspeed_multinode_launcher": "standard"}
    from overdrive import DeepSpeedPlugin

    plugin = DeepSpeedPlugin.from_config_dict(got["deepspeed_config"])  # what each worker builds
    assert plugin.get_value("zero_optimization.stage") == 3 and plugin.zero3_init_flag is True
    assert plugin.get_value("zero_optimization.offload_param.device") == "cpu" and plugin.problems() == []


def test_yaml_deepspeed_config_with_flags_on_top(tmp_path, monkeypatch):
    config = {"distributed_type": "DEEPSPEED", "deepspeed_config": {
        "zero_stage": 2, "gradient_accumulation_steps": 4, "offload_optimizer_device": "none", "zero3_init_flag": False}}
    got = _worker_config(tmp_path, monkeypatch, "--zero_stage", "1", config=config)
    assert got["distributed_type"] == "DEEPSPEED"
    assert got["deepspeed_config"]["zero_stage"] == 1 and got["deepspeed_config"]["gradient_accumulation_steps"] == 4


def test_fsdp_flags_reach_the_worker_config(tmp_path, monkeypatch):
    got = _worker_config(tmp_path, monkeypatch, "--use-fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward",
                         "false", "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--fsdp_min_num_params", "100",
                         "--fsdp_offload_params", "--fsdp_state_dict_type", "FULL_STATE_DICT",
                         "--fsdp-activation-checkpointing", "true", "--fsdp_cpu_ram_efficient_loading", "false",
                         "--fsdp_transformer_layer_cls_to_wrap", "Block", "--fsdp_sharding_strategy", "SHARD_GRAD_OP")
    assert got["distributed_type"] == "FSDP"
    assert got["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_reshard_after_forward": "false", "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
        "fsdp_min_num_params": 100, "fsdp_offload_params": True, "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_activation_checkpointing": True, "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_sharding_strategy": "SHARD_GRAD_OP"}
    from overdrive.config import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin.from_config_dict(got["fsdp_config"])
    assert plugin.reshard is False and plugin.cpu_offload is True and plugin.min_num_params == 100


def test_plugin_flag_problems_are_reported_together(tmp_path, monkeypatch):
    with pytest.raises(UsageError) as info:
        _worker_config(tmp_path, monkeypatch, "--use_deepspeed", "--use_fsdp")
    assert "--use_deepspeed and --use_fsdp cannot be used together" in str(info.value)
    with pytest.raises(UsageError) as info:
        _worker_config(tmp_path, monkeypatch, "--zero_stage", "2", "--fsdp_offload_params", "--use_deepspeed",
                       "--offload_param_device", "disk", "--gradient_clipping", "big")
    problems = info.value.problems
    assert any("--fsdp_offload_params is a flag of FSDP: add --use_fsdp" in p for p in problems), problems
    assert any("--offload_param_device: 'disk' is not valid; choose from none, cpu, nvme" in p for p in problems)
    assert any("--gradient_clipping: 'big' is not a number" in p for p in problems), problems
    with pytest.raises(UsageError) as info:
        _worker_config(tmp_path, monkeypatch, "--use_deepspeed", "--zero_stage", "5", "--deepspeed_config_file",
                       str(tmp_path / "missing.json"))
    problems = info.value.problems
    assert any("--zero_stage: 5 is not valid; choose from 0, 1, 2, 3" in p for p in problems), problems
    assert any("missing.json" in p and "does not exist" in p for p in problems), problems
    with pytest.raises(UsageError) as info:
        _worker_config(tmp_path, monkeypatch, "--use_fsdp", "--fsdp_auto_wrap_policy", "EVERYTHING")
    assert "auto_wrap_policy='everything' is not valid" in str(info.value).lower()


def test_config_file_plugin_sections_name_unknown_keys(tmp_path):
    from overdrive.launchers import config_file as cf

    with pytest.raises(cf.ConfigError) as info:
        cf.validate_config({"deepspeed_config": {"zero_stag": 2}, "fsdp_config": {"fsdp_offload_param": True}})
    text = str(info.value)
    assert "unknown key 'zero_stag' (did you mean 'zero_stage'?)" in text
    assert "unknown key 'fsdp_offload_param' (did you mean 'fsdp_offload_params'?)" in text


FSDP_SCRIPT = """
import json, sys
import torch
from torch import nn
from overdrive import Accelerator, DistributedType

acc = Accelerator()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
g = torch.Generator().manual_seed(acc.process_index)
losses = []
for _ in range(4):
    loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
fsdp = acc.strategy.fsdp
open(f"{sys.argv[1]}/result_{acc.process_index}.json", "w").write(json.dumps({
    "rank": acc.process_index, "type": acc.distributed_type.value, "strategy": acc.strategy.name,
    "reshard": fsdp.reshard, "offload": bool(fsdp.cpu_offload), "min_num_params": fsdp.min_num_params,
    "wrap": fsdp.auto_wrap_policy, "checkpointing": fsdp.activation_checkpointing,
    "state_dict_type": fsdp.state_dict_type, "sharded": type(model).__name__.startswith("FSDP"),
    "losses": losses}))
"""


@pytest.mark.timeout(120)
def test_use_fsdp_flags_reach_the_workers(tmp_path):
    script = tmp_path / "fsdp_train.py"
    script.write_text(FSDP_SCRIPT)
    result = overdrive("launch", "--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward", "false",
                       "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--fsdp_min_num_params", "1000",
                       "--fsdp_offload_params", "true", "--fsdp_activation_checkpointing", "false",
                       "--fsdp_state_dict_type", "FULL_STATE_DICT", "--num_processes", "2", str(script), str(tmp_path),
                       env=clean_env(tmp_path), timeout=110)
    for got in rank_results(result, tmp_path):
        assert got["type"] == "FSDP" and got["strategy"] == "fsdp2" and got["sharded"], got
        assert got["reshard"] is False and got["offload"] is True and got["min_num_params"] == 1000, got
        assert got["wrap"] == "size_based_wrap" and got["checkpointing"] is False, got
        assert got["state_dict_type"] == "FULL_STATE_DICT", got
