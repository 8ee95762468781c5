"""DeepSpeed's configuration as the user gives it (strategies/deepspeed/config.py): the plugin's fields and
its JSON, their conflicts reported together, the launch config's ``deepspeed_config`` keys, the
missing-package errors."""

from __future__ import annotations

import json
import sys

import pytest

from overdrive import Accelerator, DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
from overdrive.config import field_names
from overdrive.launchers.config_file import DEEPSPEED_KEYS
from overdrive.strategies.deepspeed.config import CONFIG_KEYS, import_deepspeed


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


def test_the_launch_config_file_accepts_the_plugins_keys():
    """The config file's check (below the strategies) lists the keys the plugin reads: Accelerate's names
    and the plugin's fields."""
    assert set(DEEPSPEED_KEYS) == {*CONFIG_KEYS, *field_names(DeepSpeedPlugin)}


def test_missing_packages_are_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"pip install 'overdrive\[deepspeed\]'"):
        import_deepspeed()
    with pytest.raises(ValueError, match=r"the 'deepspeed' package cannot be imported; install it with"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
