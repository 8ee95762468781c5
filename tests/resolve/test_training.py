"""resolve_training, setting by setting: each ``_resolve_*`` / ``_check_*`` step of ``resolve/training.py``, what
an argument or the launch config resolves to, and the error for a bad value (naming it and the valid choices).
Then through ``Accelerator(...)``: every problem of one call is reported at once."""

from __future__ import annotations

import pytest
import torch

from overdrive import Accelerator, GradientAccumulationPlugin
from overdrive.config import (
    ActivationCheckpointingKwargs,
    DataLoaderConfiguration,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    RNGType,
    TorchDynamoPlugin,
    TorchTensorParallelPlugin,
)
from overdrive.resolve import training
from overdrive.resolve.parallelism import resolve_parallelism
from overdrive.transforms.settings import CompileSettings
from tests.resolve.conftest import cpu_process


def _parallel(world_size: int = 1, **kwargs):
    return resolve_parallelism(cpu_process(world_size), kwargs.get("fsdp"), kwargs.get("config"), kwargs.get("tp"), [])


# -- mixed precision -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "dtype", "scaling"), [
    (None, None, False), ("no", None, False), ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True),
    ("BF16", torch.bfloat16, False), ("fp8", torch.bfloat16, False)])
def test_mixed_precision_names_resolve_to_a_policy(name, dtype, scaling):
    errors: list[str] = []
    policy = training._resolve_precision(name, cpu_process(), _parallel(), errors)
    assert errors == [] and policy is not None
    assert (policy.compute_dtype, policy.loss_scaling, policy.param_dtype) == (dtype, scaling, torch.float32)


def test_an_unknown_mixed_precision_is_refused_naming_it_and_the_choices():
    errors: list[str] = []
    assert training._resolve_precision("fp32", cpu_process(), _parallel(), errors) is None
    assert len(errors) == 1
    assert errors[0].startswith("mixed_precision='fp32' is not valid; choose from no, fp16, bf16, fp8")


def test_fp16_with_a_pipeline_is_refused_because_it_scales_the_loss():
    errors: list[str] = []
    training._resolve_precision("fp16", cpu_process(2), _parallel(2, config=ParallelismConfig(pp_size=2)), errors)
    assert len(errors) == 1 and "mixed_precision='fp16' scales the loss" in errors[0] and "'bf16' or 'no'" in errors[0]


# -- fp8 -------------------------------------------------------------------------------------------------------
def test_no_fp8_recipe_without_fp8_or_when_the_precision_was_refused():
    bf16 = training._resolve_precision("bf16", cpu_process(), _parallel(), [])
    assert training._resolve_fp8(bf16, {}, {}, cpu_process(), _parallel(), False, []) is None
    assert training._resolve_fp8(None, {"fp8": object()}, {}, cpu_process(), _parallel(), False, []) is None


# -- gradient accumulation -------------------------------------------------------------------------------------
def test_accumulation_steps_come_from_the_argument_else_the_launch_config():
    assert training._resolve_accumulation(4, None, {"gradient_accumulation_steps": 8}, None, []).num_steps == 4
    assert training._resolve_accumulation(1, None, {"gradient_accumulation_steps": 8}, None, []).num_steps == 8
    assert training._resolve_accumulation(1, None, {}, None, []).num_steps == 1


def test_the_accumulation_plugin_is_copied_and_keeps_its_settings():
    plugin = GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    resolved = training._resolve_accumulation(1, plugin, {"gradient_accumulation_steps": 8}, None, [])
    assert resolved is not plugin and (resolved.num_steps, resolved.sync_with_dataloader) == (3, False)
    assert training._resolve_accumulation(1, GradientAccumulationPlugin(), {}, None, []).num_steps == 1


@pytest.mark.parametrize("steps", [0, -1, 2.5, True, "4"])
def test_accumulation_steps_that_are_not_an_integer_from_1_are_refused(steps):
    errors: list[str] = []
    resolved = training._resolve_accumulation(steps, None, {}, None, errors)
    assert errors == [f"gradient_accumulation_steps={steps!r} is not valid; it must be an integer >= 1"]
    assert resolved.num_steps == 1


def test_accumulation_steps_given_twice_are_refused():
    errors: list[str] = []
    training._resolve_accumulation(2, GradientAccumulationPlugin(num_steps=2), {}, None, errors)
    assert len(errors) == 1 and "gradient_accumulation_steps=2 was given together with" in errors[0]
    assert "one place only" in errors[0]


# -- rng_types -------------------------------------------------------------------------------------------------
def test_rng_types_default_to_the_generator_and_take_names_or_members():
    assert training._resolve_rng_types(None, []) == ("generator",)
    assert training._resolve_rng_types([RNGType.TORCH, "generator"], []) == ("torch", "generator")


def test_an_unknown_rng_type_is_refused_naming_it_and_the_choices():
    errors: list[str] = []
    training._resolve_rng_types(["torch", "dice"], errors)
    assert len(errors) == 1 and errors[0].startswith("rng_types=['dice'] is not valid; choose from ")
    assert "generator" in errors[0] and "torch" in errors[0]


# -- log_with --------------------------------------------------------------------------------------------------
def test_log_with_becomes_a_tuple_of_the_trackers_named():
    assert training._resolve_log_with(None, None, []) == ()
    assert training._resolve_log_with("all", None, []) == ("all",)
    errors: list[str] = []
    assert training._resolve_log_with(["tensorboard", "csv"], "logs", errors) == ("tensorboard", "csv")


def test_an_unknown_tracker_is_refused_naming_it_and_the_valid_ones():
    errors: list[str] = []
    training._resolve_log_with(["tensorbored"], "logs", errors)
    assert len(errors) == 1 and errors[0].startswith("unknown tracker 'tensorbored'; valid trackers: ")
    assert "tensorboard" in errors[0]


def test_a_tracker_that_writes_files_needs_a_logging_dir():
    pytest.importorskip("tensorboard")
    errors: list[str] = []
    training._resolve_log_with("tensorboard", None, errors)
    assert errors == ["Logging with `tensorboard` requires a `logging_dir` to be passed in: give "
                      "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)"]


# -- data loaders ----------------------------------------------------------------------------------------------
def test_exact_resume_and_the_stateful_dataloader_exclude_each_other():
    errors: list[str] = []
    training._check_dataloader(DataLoaderConfiguration(exact_resume=True, use_stateful_dataloader=True), errors)
    assert errors[0] == training._BOTH_RESUMES
    errors = []
    training._check_dataloader(DataLoaderConfiguration(exact_resume=True), errors)
    training._check_dataloader(None, errors)
    assert errors == []


# -- torch.compile ---------------------------------------------------------------------------------------------
def test_no_compile_settings_without_a_backend_or_with_backend_no():
    assert training._resolve_compile(None, None, {}, []) is None
    assert training._resolve_compile(None, "no", {}, []) is None


def test_dynamo_backend_and_the_launch_configs_dynamo_config_make_compile_settings():
    assert training._resolve_compile(None, "eager", {}, []) == CompileSettings(backend="eager")
    launched = {"dynamo_backend": "inductor", "dynamo_config": {"dynamo_mode": "max-autotune",
                                                                 "dynamo_use_fullgraph": True,
                                                                 "dynamo_use_regional_compilation": True}}
    assert training._resolve_compile(None, None, launched, []) == CompileSettings(
        backend="inductor", mode="max-autotune", fullgraph=True, regional=True)
    assert training._resolve_compile(None, "eager", launched, []) == CompileSettings(  # the argument wins
        backend="eager", mode="max-autotune", fullgraph=True, regional=True)


def test_a_dynamo_plugin_is_read_and_left_as_it_was():
    plugin = TorchDynamoPlugin(mode="reduce-overhead")
    settings = training._resolve_compile(plugin, "eager", {}, [])
    assert settings == CompileSettings(backend="eager", mode="reduce-overhead") and plugin.backend is None


def test_two_backends_that_disagree_and_an_unknown_backend_are_refused():
    errors: list[str] = []
    training._resolve_compile(TorchDynamoPlugin(backend="eager"), "inductor", {}, errors)
    assert errors == ["dynamo_backend='inductor' and TorchDynamoPlugin(backend='eager') disagree; give the backend in "
                      "one place"]
    errors = []
    assert training._resolve_compile(None, "fastest", {}, errors) is None
    assert len(errors) == 1 and "backend='fastest') is not valid; choose from " in errors[0]
    assert "inductor" in errors[0]


# -- the model path's settings ---------------------------------------------------------------------------------
def test_the_model_transforms_collect_tensor_parallel_checkpointing_compile_and_precision():
    tp = TorchTensorParallelPlugin(tp_size=2, tp_plan={"fc": "colwise"}, sequence_parallel=True)
    parallel = _parallel(4, tp=tp)
    precision = training._resolve_precision("bf16", cpu_process(4), parallel, [])
    assert precision is not None
    compiled = CompileSettings(backend="eager")
    checkpointing = ActivationCheckpointingKwargs(block_names=["Block"])
    transforms = training._model_transforms(parallel, checkpointing, compiled, precision)
    assert transforms.tp_plan == {"fc": "colwise"} and transforms.tp_plan is not tp.tp_plan
    assert transforms.sequence_parallel and transforms.activation_checkpointing
    assert (transforms.block_names, transforms.compile, transforms.precision) == (("Block",), compiled, precision)


def test_fsdps_activation_checkpointing_turns_checkpointing_on():
    parallel = _parallel(2, fsdp=FullyShardedDataParallelPlugin(activation_checkpointing=True))
    precision = training._resolve_precision(None, cpu_process(2), parallel, [])
    assert precision is not None
    transforms = training._model_transforms(parallel, None, None, precision)
    assert transforms.activation_checkpointing and transforms.fsdp.activation_checkpointing
    assert not training._model_transforms(_parallel(2), None, None, precision).activation_checkpointing


# -- megatron --------------------------------------------------------------------------------------------------
def test_no_megatron_plugin_means_no_megatron_check():
    errors: list[str] = []
    training._check_megatron(None, cpu_process(), errors)
    assert errors == []


# -- through Accelerator(...) ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mixed_precision": "fp32"}, ["'fp32'", "bf16", "fp16", "no"]),
        ({"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps=0", ">= 1"]),
        ({"gradient_accumulation_steps": 2, "gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=2)},
         ["gradient_accumulation_plugin", "one place"]),
        ({"mixed_precision": "fp8-ish", "gradient_accumulation_steps": -1}, ["fp8-ish", "gradient_accumulation_steps=-1"]),
        ({"rng_types": ["dice"]}, ["dice", "generator"]),
        ({"kwargs_handlers": [object()]}, ["kwargs_handlers", "GradScalerKwargs"]),
    ],
)
def test_bad_arguments_name_the_value_and_the_choices(kwargs, words):
    with pytest.raises(ValueError) as info:
        Accelerator(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_context_parallel_on_cpu_is_refused_before_training_with_every_other_problem():
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2))
    text = str(info.value)
    assert "context parallelism, which needs CUDA" in text and "product is 2 but there are 1 processes" in text


def test_the_plan_holds_what_each_step_resolved(clean_env):
    plan = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2, dynamo_backend="eager",
                       rng_types=["torch"]).plan
    assert (plan.strategy, plan.precision.compute_dtype, plan.accumulation.num_steps) == ("single", torch.bfloat16, 2)
    assert plan.rng_types == ("torch",) and plan.dynamo_backend == "eager" and plan.transforms.compile is not None
    assert plan.device_placement and plan.step_scheduler_with_optimizer
