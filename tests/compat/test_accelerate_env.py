"""ACCELERATE_* variables read with Accelerate's meaning (bad values named), exported by ``overdrive launch``,
and ``overdrive launch --as_accelerate`` aliasing ``accelerate`` in every worker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from overdrive.launchers.accelerate_variables import settings_from_environment, variables_for_workers
from tests.support.cli import clean_env, overdrive


def test_variables_map_to_launch_settings():
    settings = settings_from_environment({
        "ACCELERATE_MIXED_PRECISION": "BF16", "ACCELERATE_USE_CPU": "true",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4", "ACCELERATE_USE_FSDP": "1", "FSDP_OFFLOAD_PARAMS": "false",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block", "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
        "ACCELERATE_DYNAMO_MODE": "max-autotune", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",  # ignored: no DeepSpeed
        "ACCELERATE_SOMETHING_INTERNAL": "whatever"})
    assert settings == {
        "mixed_precision": "bf16", "cpu": True, "gradient_accumulation_steps": 4, "distributed_type": "FSDP",
        "fsdp_config": {"fsdp_offload_params": False, "fsdp_transformer_layer_cls_to_wrap": "Block"},
        "dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}, "dynamo_backend": "inductor"}
    assert settings_from_environment({}) == {}


def test_every_bad_value_is_reported_naming_its_variable():
    with pytest.raises(ValueError) as info:
        settings_from_environment({"ACCELERATE_MIXED_PRECISION": "fp33", "ACCELERATE_USE_CPU": "maybe",
                                   "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "0"})
    text = str(info.value)
    assert "ACCELERATE_MIXED_PRECISION: 'fp33' is not valid; choose from no, fp16, bf16, fp8" in text
    assert "ACCELERATE_USE_CPU: 'maybe' is not a boolean; use true or false" in text
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS: 0 must be 1 or more" in text
    with pytest.raises(ValueError, match="both set"):
        settings_from_environment({"ACCELERATE_USE_FSDP": "1", "ACCELERATE_USE_DEEPSPEED": "1"})


def test_worker_variables_round_trip():
    config = {"mixed_precision": "bf16", "cpu": True, "gradient_accumulation_steps": 2, "distributed_type": "FSDP",
              "fsdp_config": {"fsdp_offload_params": True, "fsdp_version": 2}, "dynamo_backend": "no"}
    variables = variables_for_workers(config)
    assert variables["ACCELERATE_MIXED_PRECISION"] == "bf16" and variables["ACCELERATE_USE_FSDP"] == "true"
    back = settings_from_environment(variables)
    assert back["mixed_precision"] == "bf16" and back["cpu"] is True and back["gradient_accumulation_steps"] == 2
    assert back["fsdp_config"] == {"fsdp_offload_params": True, "fsdp_version": 2}


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_accelerator_follows_the_variables_and_refuses_a_bad_one(tmp_path):
    code = """
        import json
        from overdrive import Accelerator
        a = Accelerator()
        print(json.dumps({"precision": a.mixed_precision, "steps": a.gradient_accumulation_steps}))
    """
    good = _run(code, clean_env(tmp_path, ACCELERATE_MIXED_PRECISION="bf16", ACCELERATE_GRADIENT_ACCUMULATION_STEPS="3"))
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout.splitlines()[-1]) == {"precision": "bf16", "steps": 3}
    bad = _run(code, clean_env(tmp_path, ACCELERATE_MIXED_PRECISION="fp33"))
    assert bad.returncode != 0 and "ACCELERATE_MIXED_PRECISION: 'fp33' is not valid" in bad.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_launch_as_accelerate_aliases_and_exports_in_every_worker(tmp_path):
    script = tmp_path / "plain_accelerate.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        import accelerate
        from accelerate import Accelerator
        import overdrive
        a = Accelerator()
        # one file per rank: the two workers' stdout lines can interleave in the launcher's output
        with open(f"worker_{a.process_index}.json", "w") as f:
            json.dump({"rank": a.process_index, "aliased": accelerate.Accelerator is overdrive.Accelerator,
                       "variable": os.environ.get("ACCELERATE_MIXED_PRECISION"), "precision": a.mixed_precision}, f)
    """))
    result = overdrive("launch", "--num_processes", "2", "--mixed_precision", "bf16", "--as_accelerate", str(script),
                       env=clean_env(tmp_path), cwd=tmp_path, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads((tmp_path / f"worker_{r}.json").read_text()) for r in (0, 1)]
    assert rows == [{"rank": r, "aliased": True, "variable": "bf16", "precision": "bf16"} for r in (0, 1)]


def test_as_accelerate_refuses_a_program(tmp_path):
    result = overdrive("launch", "--as_accelerate", "--no_python", "true", env=clean_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "--as_accelerate needs a python script or module" in result.stderr


def test_rarer_variables_read_checked_and_exported(tmp_path):
    settings = settings_from_environment({
        "ACCELERATE_TORCH_DEVICE": "cpu:0", "ACCELERATE_USE_MEGATRON_LM": "true", "ACCELERATE_CPU_AFFINITY": "1",
        "ACCELERATE_USE_PARALLELISM_CONFIG": "false", "PARALLELISM_CONFIG_TP_SIZE": "2",  # switched off: ignored
        "ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "ao"})
    assert settings == {"torch_device": "cpu:0", "distributed_type": "MEGATRON_LM", "enable_cpu_affinity": True,
                        "mixed_precision": "fp8", "fp8_config": {"backend": "AO"}}
    # the fp8 back end means something only with fp8 mixed precision (as in Accelerate)
    assert settings_from_environment({"ACCELERATE_FP8_BACKEND": "TE"}) == {}
    with pytest.raises(ValueError) as info:
        settings_from_environment({"ACCELERATE_TORCH_DEVICE": "gpu7", "ACCELERATE_USE_MEGATRON_LM": "sure",
                                   "ACCELERATE_FP8_BACKEND": "fp4", "ACCELERATE_CPU_AFFINITY": "2",
                                   "ACCELERATE_USE_PARALLELISM_CONFIG": "?"})
    text = str(info.value)
    for name in ("ACCELERATE_TORCH_DEVICE: 'gpu7' is not a torch device", "ACCELERATE_USE_MEGATRON_LM: 'sure'",
                 "ACCELERATE_FP8_BACKEND: 'fp4' is not valid; choose from AO, TE",
                 "ACCELERATE_CPU_AFFINITY: '2'", "ACCELERATE_USE_PARALLELISM_CONFIG: '?'"):
        assert name in text
    with pytest.raises(ValueError, match="ACCELERATE_USE_MEGATRON_LM and ACCELERATE_USE_DEEPSPEED are both set"):
        settings_from_environment({"ACCELERATE_USE_MEGATRON_LM": "1", "ACCELERATE_USE_DEEPSPEED": "1"})

    variables = variables_for_workers({"distributed_type": "MEGATRON_LM", "torch_device": "cpu", "enable_cpu_affinity": True,
                                       "parallelism_config": {"parallelism_config_tp_size": 2},
                                       "mixed_precision": "fp8", "fp8_config": {"backend": "AO"}})
    assert {k: variables[k] for k in ("ACCELERATE_USE_MEGATRON_LM", "ACCELERATE_TORCH_DEVICE",
                                      "ACCELERATE_CPU_AFFINITY", "ACCELERATE_USE_PARALLELISM_CONFIG",
                                      "ACCELERATE_FP8_BACKEND", "PARALLELISM_CONFIG_TP_SIZE")} == {
        "ACCELERATE_USE_MEGATRON_LM": "true", "ACCELERATE_TORCH_DEVICE": "cpu", "ACCELERATE_CPU_AFFINITY": "true",
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true", "ACCELERATE_FP8_BACKEND": "AO", "PARALLELISM_CONFIG_TP_SIZE": "2"}

    # the Accelerator runs on the device the variable names
    code = """
        from overdrive import Accelerator
        print(Accelerator().device)
    """
    placed = _run(code, clean_env(tmp_path, ACCELERATE_TORCH_DEVICE="cpu:0"))
    assert placed.returncode == 0, placed.stderr
    assert placed.stdout.splitlines()[-1] == "cpu:0"
    bad = _run(code, clean_env(tmp_path, ACCELERATE_TORCH_DEVICE="gpu7"))
    assert bad.returncode != 0 and "ACCELERATE_TORCH_DEVICE: 'gpu7' is not a torch device" in bad.stderr


def test_every_variable_read_has_a_prefix_the_resolver_looks_for():
    """launch_config() loads the variables' schema only when a variable with one of these prefixes is set (a
    start-up without them skips ~45 M instructions), so every variable the schema reads must carry one."""
    from overdrive.launchers.protocol import ACCELERATE_PREFIXES
    from overdrive.launchers.settings import by_env

    names = list(by_env(None))
    assert names and all(name.startswith(ACCELERATE_PREFIXES) for name in names), \
        [name for name in names if not name.startswith(ACCELERATE_PREFIXES)]


def test_a_start_without_accelerate_variables_does_not_load_the_schema(tmp_path):
    code = ("import sys; from overdrive.launchers.protocol import launch_config; print(launch_config()); "
            "print('overdrive.launchers.settings' in sys.modules)")
    env = {k: v for k, v in clean_env(tmp_path).items() if not k.startswith(("ACCELERATE_", "FSDP_",
                                                                             "PARALLELISM_CONFIG_"))}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert plain.stdout.split() == ["{}", "False"], plain.stderr
    asked = subprocess.run([sys.executable, "-c", code], env={**env, "ACCELERATE_MIXED_PRECISION": "bf16"},
                           capture_output=True, text=True, timeout=120)
    assert asked.stdout.split() == ["{'mixed_precision':", "'bf16'}", "True"], asked.stderr
