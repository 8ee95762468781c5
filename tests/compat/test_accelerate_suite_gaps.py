"""Behaviours Accelerate's own test suite checks (scripts/accelerate_suite.py), pinned here so that they hold
without the sdist: each test names the suite test it mirrors. Accelerate 1.15's behaviour is the reference."""

from __future__ import annotations

import logging
import os
import pickle
import unittest
import warnings

import pytest
import torch
from torch import nn

from overdrive.compat.model_helpers import clean_state_dict_for_safetensors, get_model_tp_size
from overdrive.compat.operations import CannotPadNestedTensorWarning, convert_outputs_to_fp32
from overdrive.helpers.environment import convert_dict_to_env_variables, purge_accelerate_environment
from overdrive.helpers.ops import concatenate, pad_across_processes, recursively_apply
from overdrive.helpers.unwrap import extract_model_from_parallel
from overdrive.tracking import GeneralTracker
from tests.support.distributed import run_distributed


class _Sets(unittest.TestCase):
    def test_sets(self):
        os.environ["ACCELERATE_SUITE_GAP_VAR"] = "1"


@purge_accelerate_environment
class _Base:
    pass


class _Later(_Base):  # defined after the decorator ran: Accelerate wraps its test methods too
    def test_sets(self):
        os.environ["ACCELERATE_SUITE_GAP_VAR"] = "2"


def test_purge_accelerate_environment_covers_subclasses_defined_later():
    # test_utils.py::TestPytestWithInheritance, MyUnittestWithInheritance
    os.environ.pop("ACCELERATE_SUITE_GAP_VAR", None)
    _Later().test_sets()
    assert "ACCELERATE_SUITE_GAP_VAR" not in os.environ
    purged = purge_accelerate_environment(_Sets)
    purged("test_sets").test_sets()
    assert "ACCELERATE_SUITE_GAP_VAR" not in os.environ
    os.environ["ACCELERATE_SUITE_GAP_VAR"] = "kept"
    try:
        _Later().test_sets()
        assert os.environ["ACCELERATE_SUITE_GAP_VAR"] == "kept"  # an existing value comes back
    finally:
        del os.environ["ACCELERATE_SUITE_GAP_VAR"]


def test_convert_dict_to_env_variables_skips_unsafe_entries_with_a_warning(caplog):
    # test_utils.py::UtilsTester::test_convert_dict_to_env_variables
    env = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "SPACE": "a b", "EMPTY": "", "OTHER_ENV": "2"}
    with caplog.at_level(logging.WARNING, logger="accelerate.utils.environment"):
        lines = convert_dict_to_env_variables(env)
    assert lines == ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    skipped = [r.getMessage() for r in caplog.records if r.name == "accelerate.utils.environment"]
    assert len(skipped) == 3 and "BAD_ENV_NAME" in skipped[0]


def test_recursively_apply_names_the_unsupported_type_as_accelerate_does():
    # test_utils.py::UtilsTester::test_honor_type (the exact wording is compared there)
    with pytest.raises(TypeError) as error:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(error.value) == ("Unsupported types (<class 'int'>) passed to `tensor`. Only nested "
                                "list/tuple/dicts of objects that are valid for `is_torch_tensor` should be passed.")


def test_concatenate_returns_a_single_non_tensor_batch_as_it_is():
    # test_utils.py::UtilsTester::test_concatenate
    assert concatenate(["text"]) == "text"
    with pytest.raises(TypeError, match="str"):
        concatenate(["a", "b"])


def test_pad_across_processes_leaves_nested_tensors_and_out_of_range_dims():
    # test_utils.py::UtilsTester::test_pad_across_processes
    nested = torch.nested.nested_tensor([[1, 2, 3], [1]])
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested
    tensor = torch.zeros(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pad_across_processes(tensor, dim=-4) is tensor


def test_get_model_tp_size_reads_what_transformers_records():
    # test_utils.py::UtilsTester::test_get_model_tp_size
    model = nn.Linear(2, 2)
    assert get_model_tp_size(model) is None
    model.tp_size = 2
    assert get_model_tp_size(model) == 2
    model.tp_size = None  # transformers 5: a stub on the model, the degree in config.distributed_config
    model.config = type("Config", (), {"distributed_config": {"tp_size": 4}})()
    assert get_model_tp_size(model) == 4


def test_clean_state_dict_for_safetensors_warns_about_each_removed_tie(caplog):
    # test_utils.py::UtilsTester::test_save_safetensor_shared_memory
    linear = nn.Linear(3, 3)
    state = {"a.weight": linear.weight, "b.weight": linear.weight, "c": torch.ones(1)}
    with caplog.at_level(logging.WARNING):
        clean = clean_state_dict_for_safetensors(state)
    assert list(clean) == ["a.weight", "c"]
    assert len(caplog.records) == 1 and "Removed shared tensor ['b.weight']" in caplog.records[0].getMessage()


class _Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a


def test_extract_model_without_fp32_wrapper_restores_the_original_forward():
    # test_utils.py::UtilsTester::test_can_undo_convert_outputs
    model = _Regression()
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    plain = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in plain.__dict__ and "_original_forward" not in plain.__dict__
    assert torch.equal(pickle.loads(pickle.dumps(plain))(torch.ones(2)), torch.full((2,), 2.0))


def test_extract_model_looks_through_torch_compile_without_changing_it():
    # test_utils.py::UtilsTester::test_dynamo_extract_model_keep_torch_compile / _remove_torch_compile
    model = _Regression()
    parallel = nn.DataParallel(model)
    compiled = torch.compile(parallel)
    kept = extract_model_from_parallel(compiled, keep_torch_compile=True)
    assert type(kept) is type(compiled) and kept._orig_mod is model
    assert compiled._orig_mod is parallel  # the user's compiled wrapper is left as it was
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    assert extract_model_from_parallel(torch.compile(model)) is not model


def test_accelerator_unwrap_model_looks_through_a_user_added_wrapper_and_compile():
    # test_accelerator.py::AcceleratorTester::test_can_unwrap_distributed_compiled_model_*
    from overdrive import Accelerator

    model = _Regression()
    compiled = torch.compile(nn.DataParallel(model))
    accelerator = Accelerator(cpu=True)
    assert accelerator.unwrap_model(compiled, keep_torch_compile=True)._orig_mod is model
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model


def _unwrap_compiled_ddp() -> dict:
    from overdrive import Accelerator

    accelerator = Accelerator(cpu=True)
    model = _Regression()
    prepared = accelerator.prepare(model)
    compiled = torch.compile(prepared)  # compiled after prepare: DDP inside the compiled wrapper
    kept = accelerator.unwrap_model(compiled)
    return {"ddp": type(prepared).__name__, "kept_inner_is_model": kept._orig_mod is model,
            "kept_type": type(kept).__name__, "compiled_untouched": compiled._orig_mod is prepared,
            "plain_is_model": accelerator.unwrap_model(compiled, keep_torch_compile=False) is model}


@pytest.mark.timeout(120)
def test_unwrap_model_removes_ddp_inside_torch_compile_on_two_processes():
    for out in run_distributed(_unwrap_compiled_ddp, 2):
        assert out == {"ddp": "DistributedDataParallel", "kept_inner_is_model": True, "kept_type": "OptimizedModule",
                       "compiled_untouched": True, "plain_is_model": True}


class _FlaggedTracker(GeneralTracker):
    name = "suite_gap_tracker"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, **kwargs) -> None:
        super().__init__()
        self.run_name, self.logging_dir = run_name, logging_dir

    @property
    def tracker(self):
        return self


def test_trackers_needing_a_directory_are_refused_without_one_and_registration_is_checked(tmp_path):
    # test_tracking.py::TensorBoardTrackingTest::test_project_dir, RegisterTrackerClassTest
    from overdrive import Accelerator
    from overdrive.tracking import LOGGER_TYPE_TO_CLASS, register_tracker_class

    with pytest.raises(ValueError, match="Logging with `tensorboard` requires a `logging_dir`"):
        Accelerator(cpu=True, log_with="tensorboard")
    with pytest.raises(ValueError):
        register_tracker_class(dict)

    class NoFlag(GeneralTracker):  # the base class's default does not count: Accelerate's has none
        name = "no_flag"

    with pytest.raises(ValueError, match="requires_logging_directory"):
        register_tracker_class(NoFlag)
    snapshot = dict(LOGGER_TYPE_TO_CLASS)
    try:
        register_tracker_class(_FlaggedTracker)
        with pytest.warns(UserWarning, match="suite_gap_tracker"):
            register_tracker_class(_FlaggedTracker)
        with pytest.raises(ValueError, match="Logging with `suite_gap_tracker` requires a `logging_dir`"):
            Accelerator(cpu=True, log_with="suite_gap_tracker")
        accelerator = Accelerator(cpu=True, log_with="suite_gap_tracker", project_dir=str(tmp_path))
        accelerator.init_trackers("run")
        assert accelerator.get_tracker("suite_gap_tracker").logging_dir == str(tmp_path)
    finally:
        LOGGER_TYPE_TO_CLASS.clear()  # Accelerate's tests restore the registry this way
        LOGGER_TYPE_TO_CLASS.update(snapshot)
    assert "suite_gap_tracker" not in LOGGER_TYPE_TO_CLASS and "tensorboard" in LOGGER_TYPE_TO_CLASS


def test_partial_state_debug_is_settable_and_shared():
    # test_cpu.py (Accelerate's test_ops.py sets PartialState().debug = True)
    from overdrive.training.state import PartialState

    state = PartialState()
    before = state.debug
    try:
        state.debug = True
        assert PartialState().debug is True
    finally:
        state.debug = before


def test_distributed_type_has_every_member_of_accelerate_1_15():
    # Accelerate's test_sync.py (run by test_grad_sync.py) names MULTI_SDAA and MULTI_NEURON
    from overdrive.config import DistributedType

    assert {m.value for m in DistributedType} >= {
        "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
        "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON"}


def test_torch_dynamo_plugin_reads_the_launched_variables_and_gives_only_what_differs(monkeypatch):
    # test_kwargs_handlers.py::KwargsHandlerTester::test_torch_dynamo_plugin
    from overdrive.config import TorchDynamoPlugin

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_ts_nvfuser")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    assert TorchDynamoPlugin().to_kwargs() == {"backend": "aot_ts_nvfuser", "mode": "reduce-overhead"}
    assert TorchDynamoPlugin(backend="eager").to_kwargs() == {"backend": "eager", "mode": "reduce-overhead"}
