"""Every flag of the real ``accelerate launch`` is a flag of ``overdrive launch``, and a sample of them exports
the same ``ACCELERATE_*`` / ``PARALLELISM_CONFIG_*`` / ``FSDP_*`` variables as Accelerate's own launcher
(``prepare_simple_launcher_cmd_env`` / ``prepare_multi_gpu_env``), in-process, no workers started.
Unsupported features (TPU, mpirun, Megatron-LM's engine) are refused naming the flag."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from overdrive.cli import Parser, UsageError
from overdrive.cli.launch import add_launch_flags, plan_launch
from overdrive.launchers.torchrun import worker_environ


def _ours(argv: list[str], script: Path) -> dict[str, str]:
    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    plan, _, _ = plan_launch(parser.parse_args([*argv, str(script)]))
    return {k: v for k, v in worker_environ(plan).items() if v is not None}


def _theirs(argv: list[str], script: Path) -> dict[str, str]:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args([*argv, str(script)])
    args, *_ = _validate_launch_command(args)
    if args.use_fsdp or args.multi_gpu:
        return prepare_multi_gpu_env(args)
    return prepare_simple_launcher_cmd_env(args)[1]


def _norm(value: str) -> str:
    low = value.lower()
    return {"1": "true", "0": "false"}.get(low, low)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default Accelerate config either
    path = tmp_path / "train.py"
    path.write_text("")
    return path


@pytest.mark.requires("accelerate")
def test_every_accelerate_launch_flag_is_accepted() -> None:
    from accelerate.commands.launch import launch_command_parser

    real = {option for action in launch_command_parser()._actions for option in action.option_strings}
    parser = argparse.ArgumentParser()
    add_launch_flags(parser)
    ours = {option for action in parser._actions for option in action.option_strings}
    assert sorted(real - ours) == []


BASE = ["--cpu", "--num_processes", "2"]
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--num_processes", "2"]
SAMPLES = [
    ["--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune", "--dynamo_use_fullgraph",
     "--dynamo_use_dynamic", "--dynamo_use_regional_compilation"],
    ["--enable_cpu_affinity"],
    ["--mixed_precision", "fp8", "--fp8_backend", "ao", "--fp8_pad_inner_dim", "false",
     "--fp8_enable_fsdp_float8_all_gather", "false"],
    ["--mixed_precision", "fp8", "--fp8_backend", "ao", "--fp8_format", "E4M3", "--fp8_margin", "2",
     "--fp8_amax_history_len", "16", "--fp8_amax_compute_algo", "max", "--fp8_interval", "3"],
    ["--mixed_precision", "bf16", "--gradient_accumulation_steps", "4", "--debug"],
]
FSDP_SAMPLES = [
    ["--fsdp_reshard_after_forward", "false", "--fsdp_offload_params", "true", "--fsdp_activation_checkpointing",
     "true", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
    ["--use_parallelism_config", "--parallelism_config_dp_shard_size", "2"],
    ["--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_cp_size",
     "1", "--parallelism_config_tp_size", "1"],
]


def _delta(env: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    prefixes = ("ACCELERATE_", "PARALLELISM_CONFIG_", "FSDP_")
    return {k: _norm(v) for k, v in env.items() if k.startswith(prefixes) and base.get(k) != v}


@pytest.mark.requires("accelerate")
@pytest.mark.parametrize("base,flags", [(BASE, s) for s in SAMPLES] + [(FSDP2, s) for s in FSDP_SAMPLES],
                         ids=lambda v: " ".join(v)[:60])
def test_exported_variables_match_accelerate(script: Path, base: list[str], flags: list[str]) -> None:
    theirs = _delta(_theirs([*base, *flags], script), _theirs(base, script))
    ours = _delta(_ours([*base, *flags], script), _ours(base, script))
    assert theirs, "the sample changes nothing under Accelerate: not a sample"
    missing = {k: v for k, v in theirs.items() if ours.get(k) != v}
    assert missing == {}, f"Accelerate exports {theirs}, overdrive {ours}"


@pytest.mark.parametrize("flags,named", [
    (["--tpu"], "--tpu"), (["--tpu_cluster"], "--tpu_cluster"), (["--env", "A=1"], "--env"),
    (["--mpirun_hostfile", "hosts"], "--mpirun_hostfile"),
    (["--use_megatron_lm", "--megatron_lm_tp_degree", "2"], "--use_megatron_lm"),
    (["--use_parallelism_config", "--parallelism_config_sp_size", "2"], "--parallelism_config_sp_size"),
    (["--fsdp_activation_checkpointing_offload", "true"], "--fsdp_activation_checkpointing_offload"),
])
def test_unsupported_features_are_refused_naming_the_flag(script: Path, flags: list[str], named: str) -> None:
    with pytest.raises(UsageError) as info:
        _ours([*BASE, *flags], script)
    assert any(problem.startswith(named) for problem in info.value.problems), info.value.problems


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is here")
def test_fp8_backend_flag_is_checked_before_launch(script: Path) -> None:
    """overdrive checks the back end the flag names before it starts workers (Accelerate: at the first layer)."""
    with pytest.raises(UsageError, match="transformer_engine"):
        _ours([*BASE, "--mixed_precision", "fp8", "--fp8_backend", "te"], script)


def test_ignored_flags_are_accepted_as_accelerate_accepts_them(script: Path) -> None:
    """Flags Accelerate reads only on TPUs / SageMaker or with a switch that is off change nothing."""
    quiet = ["--downcast_bf16", "--main_training_function", "main", "--aws_access_key_id", "x",
             "--megatron_lm_tp_degree", "2", "--parallelism_config_tp_size", "2", "--fp8_margin", "3",
             "--no_tpu_cluster", "--fsdp_activation_checkpointing_offload", "false"]
    assert _delta(_ours([*BASE, *quiet], script), _ours(BASE, script)) == {"ACCELERATE_DOWNCAST_BF16": "true"}


def test_worker_resolves_the_flags(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's Accelerator reads what the flags put in the launch config (compile mode, fullgraph,
    dynamic, regional compilation), with no argument in the script."""
    from overdrive import Accelerator
    from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR
    from overdrive.training.state import AcceleratorState

    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    plan, _, _ = plan_launch(parser.parse_args(["--cpu", "--dynamo_backend", "inductor", "--dynamo_mode",
                                                "max-autotune", "--dynamo_use_fullgraph", "--dynamo_use_dynamic",
                                                "--dynamo_use_regional_compilation", str(script)]))
    for name, value in worker_environ(plan).items():
        if value is not None and (name == LAUNCH_CONFIG_VAR or name.startswith("ACCELERATE_")):
            monkeypatch.setenv(name, value)
    try:
        compiled = Accelerator(cpu=True).plan.transforms.compile
    finally:
        AcceleratorState._reset_state(True)
    assert (compiled.backend, compiled.mode, compiled.fullgraph, compiled.dynamic, compiled.regional) == \
        ("inductor", "max-autotune", True, True, True)
