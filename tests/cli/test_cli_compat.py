"""The Accelerate commands overdrive lacked: merge-weights (registered), to-fsdp2, tpu-config (refused)."""

from __future__ import annotations

import yaml

from overdrive.cli.to_fsdp2_cmd import convert
from tests.support.cli import clean_env, overdrive


def test_merge_weights_is_a_registered_command(tmp_path):
    result = overdrive("merge-weights", "--help", env=clean_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 0 and "merge-weights" in result.stdout
    missing = overdrive("merge-weights", str(tmp_path / "nope"), str(tmp_path / "out"), env=clean_env(tmp_path))
    assert missing.returncode != 0 and "unknown command" not in missing.stderr


def test_to_fsdp2_rewrites_fsdp1_keys(tmp_path):
    source = tmp_path / "fsdp1.yaml"
    source.write_text(yaml.safe_dump({"distributed_type": "FSDP", "mixed_precision": "bf16", "fsdp_config": {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_use_orig_params": True, "fsdp_offload_params": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block"}}))
    target = tmp_path / "fsdp2.yaml"
    result = overdrive("to-fsdp2", "--config_file", str(source), "--output_file", str(target), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "dropped fsdp_backward_prefetch" in result.stderr and "dropped fsdp_use_orig_params" in result.stderr
    written = yaml.safe_load(target.read_text())
    assert written["mixed_precision"] == "bf16" and written["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "Block"}
    again = overdrive("to-fsdp2", "--config_file", str(source), "--output_file", str(target), env=clean_env(tmp_path))
    assert again.returncode == 2 and "exists already" in again.stderr
    assert convert(written)[1] == ["fsdp_config already says fsdp_version: 2: nothing to convert"]
    # the converted file launches: overdrive reads it
    from overdrive.config import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin.from_config_dict(written["fsdp_config"])
    assert plugin.reshard_after_forward is False


def test_to_fsdp2_needs_an_output(tmp_path):
    source = tmp_path / "c.yaml"
    source.write_text("fsdp_config: {fsdp_sharding_strategy: FULL_SHARD}\n")
    result = overdrive("to-fsdp2", "--config_file", str(source), env=clean_env(tmp_path))
    assert result.returncode == 2 and "--output_file PATH, or --overwrite" in result.stderr


def test_tpu_config_prints_the_gcloud_line_and_names_what_is_missing(tmp_path):
    result = overdrive("tpu-config", "--tpu_name", "pod", "--command", "ls", env=clean_env(tmp_path))
    assert result.returncode == 2 and "no tpu_zone: give --tpu_zone" in result.stderr
    result = overdrive("tpu-config", "--tpu_name", "pod", "--tpu_zone", "z", "--command", "ls", "--debug",
                       env=clean_env(tmp_path))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == "Running gcloud compute tpus tpu-vm ssh pod --zone z --command cd /usr/share; ls --worker all\n"
