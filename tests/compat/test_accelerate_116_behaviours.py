"""The behaviours Accelerate 1.16.0 changed from 1.15, each compared with the real Accelerate 1.16.0 (installed
as the reference): launch flags and their defaults, the config file readers, ``tpu-config``, ``to-fsdp2``,
the helpers (``dtype_byte_size``, ``split_between_processes``, ``skip_first_batches``, ``compile_regions``,
``synchronize_rng_state``, ``get_logger``), disk offload and ``save_state`` with nothing prepared."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import random
import types
from unittest import mock

import pytest
import torch
import yaml

pytestmark = pytest.mark.requires("accelerate")


@pytest.fixture
def no_config(tmp_path, monkeypatch):
    """No default config file on either side: Accelerate's defaults, not this machine's file."""
    import accelerate.commands.launch as real_launch

    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(real_launch, "default_config_file", str(tmp_path / "none.yaml"))
    for name in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return script


def _both_launch_namespaces(argv: list[str]):
    from accelerate.commands import launch as real

    from overdrive.compat import cli_launch as ours

    real_args, _, _ = real._validate_launch_command(real.launch_command_parser().parse_args(argv))
    our_args, _, _ = ours._validate_launch_command(ours.launch_command_parser().parse_args(argv))
    return real_args, our_args


def test_dynamo_use_dynamic_is_unset_unless_given_and_cpu_means_one_process(no_config):
    from accelerate.commands import launch as real
    from accelerate.utils import TorchDynamoPlugin as RealPlugin

    from overdrive.compat import cli_launch as ours
    from overdrive.config import TorchDynamoPlugin

    for flags in ([], ["--dynamo_use_dynamic"]):
        argv = ["--dynamo_backend", "eager", *flags, str(no_config)]
        real_args, our_args = _both_launch_namespaces(argv)
        assert our_args.dynamo_use_dynamic == real_args.dynamo_use_dynamic == (True if flags else None)
        _, real_env = real.prepare_simple_launcher_cmd_env(real_args)
        _, our_env = ours.prepare_simple_launcher_cmd_env(our_args)
        with mock.patch.dict(os.environ, real_env, clear=True):
            expected = RealPlugin().dynamic
        with mock.patch.dict(os.environ, our_env, clear=True):
            assert TorchDynamoPlugin().dynamic is expected is (True if flags else None)
    real_args, our_args = _both_launch_namespaces(["--cpu", str(no_config)])
    assert (our_args.num_processes, our_args.multi_gpu) == (real_args.num_processes, real_args.multi_gpu) == (1, False)


def test_launch_flags_removed_in_116_are_refused_as_accelerate_refuses_them():
    from accelerate.commands.launch import launch_command_parser as real_parser

    from overdrive.compat.cli_launch import launch_command_parser
    from overdrive.launchers.settings import by_name

    for parser in (real_parser(), launch_command_parser()):
        with pytest.raises(SystemExit), mock.patch("sys.stderr"):
            parser.parse_args(["--fp8_opt_level", "O1", "t.py"])
    with pytest.raises(SystemExit), mock.patch("sys.stderr"):
        real_parser().parse_args(["--fp8_backend", "msamp", "t.py"])
    # overdrive checks values when it plans the launch (every problem at once), with the same choices
    _, problem = by_name()["fp8_backend"].check("--fp8_backend", "msamp")
    assert problem is not None and "choose from AO, TE" in problem


def test_child_stderr_bounds_are_accelerates():
    from accelerate.commands import launch as real

    from overdrive.launchers import failure_report

    assert (failure_report.CHILD_STDERR_CHUNK_SIZE, failure_report.CHILD_STDERR_TAIL_CHUNKS) == \
        (real.CHILD_STDERR_CHUNK_SIZE, real.CHILD_STDERR_TAIL_CHUNKS)


def test_dtype_byte_size_counts_storage_as_accelerate_does():
    from accelerate.utils import CustomDtype as RealCustom
    from accelerate.utils import dtype_byte_size as real

    from overdrive.big_model.sizes import dtype_byte_size

    dtypes = [torch.uint4, torch.bool, torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8]
    dtypes += [getattr(torch, name) for name in ("float4_e2m1fn_x2", "int4", "uint1") if hasattr(torch, name)]
    for dtype in dtypes:
        assert dtype_byte_size(dtype) == real(dtype), dtype
    assert dtype_byte_size(torch.uint4) == 1
    for custom in RealCustom:  # the names of packed quantized weights keep their packed sizes
        assert dtype_byte_size(custom.value) == real(custom)


def test_split_between_processes_pads_tuples_as_accelerate():
    from accelerate.state import PartialState as RealState

    from overdrive.training.state import PartialState

    for inputs in (("a", "b", "c"), ["a", "b", "c"], (1, 2, 3, 4, 5), {"x": (1, 2, 3), "y": [4, 5, 6]}):
        for index in range(2):
            for padding in (False, True):
                place = types.SimpleNamespace(num_processes=2, process_index=index)
                fresh = {k: v for k, v in inputs.items()} if isinstance(inputs, dict) else inputs
                with RealState.split_between_processes(place, fresh, apply_padding=padding) as expected:
                    pass
                with PartialState.split_between_processes(place, inputs, apply_padding=padding) as got:
                    assert got == expected and type(got) is type(expected), (inputs, index, padding)


def test_skip_first_batches_keeps_the_loaders_settings_as_accelerate():
    from accelerate.data_loader import DataLoaderDispatcher as RealDispatcher
    from accelerate.data_loader import DataLoaderShard as RealShard
    from accelerate.data_loader import prepare_data_loader as real_prepare
    from accelerate.data_loader import skip_first_batches as real_skip
    from torch.utils.data import DataLoader

    from overdrive.data import DataLoaderDispatcher, DataLoaderShard, prepare_data_loader, skip_first_batches

    def described(prepare, skip):
        loader = skip(prepare(DataLoader(range(10), batch_size=2, drop_last=True), num_processes=2, process_index=0),
                      num_batches=1)
        return [b.tolist() for b in loader], loader.remainder, loader.total_batch_size

    assert described(prepare_data_loader, skip_first_batches) == described(real_prepare, real_skip)
    for ours, real in ((DataLoaderShard, RealShard), (DataLoaderDispatcher, RealDispatcher)):
        for loader, skip in ((ours(list(range(16)), batch_size=4, _drop_last=True, _non_blocking=True),
                              skip_first_batches),
                             (real(list(range(16)), batch_size=4, _drop_last=True, _non_blocking=True), real_skip)):
            resumed = skip(loader, num_batches=1)
            assert (resumed._drop_last, resumed._non_blocking) == (True, True)


class _Block(torch.nn.Module):
    """transformers' GradientCheckpointingLayer: ``__call__`` runs under activation checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4, bias=False)

    def __call__(self, *args, **kwargs):
        return torch.utils.checkpoint.checkpoint(super().__call__, *args, use_reentrant=False, **kwargs)

    def forward(self, x):
        x = self.linear(x)
        torch._dynamo.graph_break()
        return x.sin()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_compile_regions_compiles_activation_checkpointed_blocks_as_accelerate():
    from accelerate.utils import compile_regions as real

    from overdrive.compat.regions import compile_regions

    torch.manual_seed(0)
    model, inputs = _Model(), torch.randn(2, 4)
    expected = model(inputs)
    for regions in (compile_regions, real):
        graphs = []

        def recording(graph_module, example_inputs, graphs=graphs):
            graphs.append(graph_module)
            return graph_module.forward

        torch._dynamo.reset()
        torch.testing.assert_close(regions(model, backend=recording)(inputs), expected)
        assert graphs, regions.__module__  # the blocks ran compiled, across the checkpoint's graph break


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1, self.batchnorm, self.linear2 = torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 5)


@pytest.mark.parametrize("device_map", [{"": "disk"}, {"linear1": "cpu", "batchnorm": "disk", "linear2": "disk"}])
def test_disk_offload_writes_accelerates_files(tmp_path, device_map):
    from accelerate.utils import load_checkpoint_in_model as real
    from safetensors.torch import save_file

    from overdrive.big_model.loading import load_checkpoint_in_model

    checkpoint = tmp_path / "model.safetensors"
    save_file(_Small().state_dict(), str(checkpoint), metadata={"format": "pt"})
    for name, load in (("ours", load_checkpoint_in_model), ("real", real)):
        load(_Small(), str(checkpoint), device_map=device_map, offload_folder=str(tmp_path / name))
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "real"))
    load_checkpoint_in_model(_Small(), str(checkpoint), device_map=device_map, offload_folder=str(tmp_path / "in"),
                             offload_in_place=True)  # overdrive's switch: the index points into the checkpoint
    assert os.listdir(tmp_path / "in") == ["index.json"]


def test_save_state_with_nothing_prepared_saves_the_random_states(tmp_path):
    import accelerate

    from overdrive import Accelerator
    from overdrive.training.state import AcceleratorState, GradientState

    real = accelerate.Accelerator()
    real.save_state(str(tmp_path / "real"))
    accelerate.state.AcceleratorState._reset_state(True)
    accelerate.state.GradientState._reset_state()
    accelerator = Accelerator()
    folder = accelerator.save_state(str(tmp_path / "ours"), accelerate_layout=True)
    assert set(os.listdir(tmp_path / "real")) == {"random_states_0.pkl"} <= set(os.listdir(folder))
    torch.manual_seed(3)
    random.seed(3)
    folder = accelerator.save_state(str(tmp_path / "again"))
    drawn = torch.rand(2), random.random()
    accelerator.load_state(folder)
    assert torch.equal(torch.rand(2), drawn[0]) and random.random() == drawn[1]
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_synchronize_rng_state_takes_the_rng_type_first_and_requires_it():
    from accelerate.utils import synchronize_rng_state as real

    from overdrive.helpers.random import synchronize_rng_state

    ours, theirs = inspect.signature(synchronize_rng_state), inspect.signature(real)
    assert list(ours.parameters) == list(theirs.parameters) == ["rng_type", "generator"]
    assert ours.parameters["rng_type"].default is theirs.parameters["rng_type"].default is inspect.Parameter.empty


def test_get_logger_leaves_levels_alone_without_a_level_asked_for(monkeypatch):
    from accelerate.logging import get_logger as real

    from overdrive.helpers.logging import get_logger

    monkeypatch.delenv("ACCELERATE_LOG_LEVEL", raising=False)
    monkeypatch.delenv("OVERDRIVE_LOG_LEVEL", raising=False)
    root = logging.getLogger().level
    for name, make in (("behave116.real", real), ("behave116.ours", get_logger)):
        make(name)
        assert logging.getLogger(name).level == logging.NOTSET and logging.getLogger().level == root


# -- the config file commands -------------------------------------------------------------------------------
TPU_CONFIG = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no",
              "use_cpu": False, "debug": False, "num_processes": 1, "tpu_name": "test-tpu",
              "tpu_zone": "us-central1-a", "commands": None}


@pytest.fixture
def tpu_files(tmp_path, no_config):
    commands = tmp_path / "commands.sh"
    commands.write_text('echo "hello world"\necho "this is a second command"')
    config = tmp_path / "latest.yaml"
    config.write_text(yaml.safe_dump({**TPU_CONFIG, "command_file": str(commands)}))
    old = tmp_path / "0_12_0.yaml"
    old.write_text(yaml.safe_dump({k: v for k, v in TPU_CONFIG.items() if not k.startswith(("tpu", "command"))}))
    return config, old, commands


def test_tpu_config_prints_accelerates_gcloud_command(tpu_files, capsys):
    from accelerate.commands.tpu import tpu_command_launcher as real
    from accelerate.commands.tpu import tpu_command_parser as real_parser

    from overdrive.compat.cli_commands import tpu_command_launcher, tpu_command_parser

    config, old, commands = tpu_files
    where = ["--tpu_zone", "us-central1-a", "--tpu_name", "test-tpu"]
    cases = [["--command", "ls", *where], ["--config_file", str(old), "--command", "ls", *where],
             ["--config_file", str(config)], ["--config_file", str(config), "--command", "ls"],
             ["--config_file", str(config), "--command", "ls", "--command", 'echo "Hello World"'],
             ["--config_file", str(config), "--command_file", str(commands)],
             ["--config_file", str(old), "--command_file", str(commands), *where],
             ["--config_file", str(config), "--install_accelerate"],
             ["--config_file", str(config), "--install_accelerate", "--accelerate_version", "12.0.0"],
             ["--config_file", str(config), "--install_accelerate", "--accelerate_version", "dev", "--use_alpha"]]
    for argv in cases:
        real(real_parser().parse_args([*argv, "--debug"]))
        expected = capsys.readouterr().out
        tpu_command_launcher(tpu_command_parser().parse_args([*argv, "--debug"]))
        assert capsys.readouterr().out == expected, argv
        assert expected.startswith("Running gcloud ")
    with pytest.raises(ValueError, match="--command COMMAND"):
        tpu_command_launcher(tpu_command_parser().parse_args(where))


def test_tpu_config_command_runs_nothing_without_debug(tpu_files, tmp_path):
    from tests.support.cli import clean_env, overdrive

    config, _, _ = tpu_files
    env = clean_env(tmp_path, PATH=str(tmp_path))  # no gcloud to run, were it tried
    result = overdrive("tpu-config", "--config_file", str(config), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ('Running gcloud compute tpus tpu-vm ssh test-tpu --zone us-central1-a --command cd '
                             '/usr/share; echo "hello world"; echo "this is a second command" --worker all\n')
    assert "was not run" in result.stderr


def test_a_key_written_twice_takes_its_last_value_with_a_warning(tmp_path, no_config):
    from accelerate.commands.config.config_args import load_config_from_file as real

    from overdrive.compat.cli_commands import SageMakerConfig
    from overdrive.compat.config_commands import load_config_from_file

    path = tmp_path / "0_30_0_sagemaker.yaml"  # Accelerate's own test file: debug twice, distributed_type NO
    path.write_text("compute_environment: AMAZON_SAGEMAKER\ndebug: false\ndistributed_type: NO\n"
                    "mixed_precision: fp16\ndebug: true\nuse_cpu: false\nec2_instance_type: MY_TYPE\n"
                    "iam_role_name: MY_ROLE\n")
    expected = real(str(path))
    with pytest.warns(UserWarning, match=r"the key 'debug' appears twice in one mapping \(lines 2 and 5\)"):
        config = load_config_from_file(str(path))
    assert isinstance(config, SageMakerConfig)
    for name in ("debug", "mixed_precision", "ec2_instance_type", "iam_role_name", "use_cpu"):
        assert getattr(config, name) == getattr(expected, name), name
    assert config.debug is True


def test_to_fsdp2_writes_accelerates_result_read_back_as_a_cluster_config(tmp_path, no_config):
    from accelerate.commands.to_fsdp2 import to_fsdp2_command as real

    from overdrive.compat.cli_commands import ClusterConfig, to_fsdp2_command
    from overdrive.compat.config_commands import load_config_from_file

    source = tmp_path / "fsdp1.yaml"
    source.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "FSDP", "mixed_precision": "no",
        "num_processes": 1, "use_cpu": False, "fsdp_config": {
            "fsdp_activation_checkpointing": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_forward_prefetch": False, "fsdp_offload_params": False, "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_sync_module_states": True,
            "fsdp_transformer_layer_cls_to_wrap": "BertLayer", "fsdp_use_orig_params": True}}))
    for name, command in (("real", real), ("ours", to_fsdp2_command)):
        command(argparse.Namespace(config_file=str(source), output_file=str(tmp_path / f"{name}.yaml"),
                                   overwrite=False))
    assert yaml.safe_load((tmp_path / "ours.yaml").read_text()) == yaml.safe_load((tmp_path / "real.yaml").read_text())
    config = load_config_from_file(str(tmp_path / "ours.yaml"))
    assert isinstance(config, ClusterConfig) and config.fsdp_config["fsdp_version"] == 2
    # the reader is looked up where Accelerate's tests patch it
    with mock.patch("overdrive.commands.to_fsdp2.load_config", return_value={"fsdp_config": {"fsdp_version": 2}}), \
            _logs_warning("Config already specifies FSDP2"):
        to_fsdp2_command(argparse.Namespace(config_file=str(source), output_file=str(tmp_path / "again.yaml"),
                                            overwrite=False))


class _logs_warning:
    """A block that must log a WARNING containing ``text`` (any logger)."""

    def __init__(self, text: str) -> None:
        self.text, self.records = text, []

    def __enter__(self):
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = self.records.append  # type: ignore[method-assign]
        logging.getLogger().addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeHandler(self.handler)
        assert any(self.text in record.getMessage() for record in self.records), self.records
        return False


def test_mpirun_line_uses_the_patchable_which_of_utils_launch(tmp_path, no_config):
    from accelerate.commands import launch as real

    from overdrive.compat import cli_launch as ours

    config = tmp_path / "mpi.yaml"
    config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_CPU",
        "machine_rank": 0, "main_process_ip": "127.0.0.1", "main_process_port": 29500, "mixed_precision": "no",
        "mpirun_config": {"mpirun_ccl": "1", "mpirun_hostfile": "/home/user/hostfile"}, "num_machines": 4,
        "num_processes": 16, "rdzv_backend": "static", "same_network": True, "use_cpu": True}))
    lines = {}
    for name, module, patched in (("real", real, "accelerate.utils.launch"), ("ours", ours, "overdrive.utils.launch")):
        args = module.launch_command_parser().parse_args([str(no_config), "--cpu"])
        args.config_file = str(config)
        args, _, _ = module._validate_launch_command(args)
        for version in (b"Intel MPI", b"mpirun (Open MPI) 4.1"):
            with mock.patch(f"{patched}.which", return_value=True), \
                    mock.patch(f"{patched}.subprocess.check_output", return_value=version):
                command, _ = module.prepare_simple_launcher_cmd_env(args)
            lines[name, version] = command[:command.index(str(no_config)) - 1]
    assert lines["ours", b"Intel MPI"] == lines["real", b"Intel MPI"] == \
        ["mpirun", "-f", "/home/user/hostfile", "-ppn", "4", "-n", "16"]
    assert lines["ours", b"mpirun (Open MPI) 4.1"] == lines["real", b"mpirun (Open MPI) 4.1"]
    args.mpirun_hostfile = "/home/user/hostfile"
    with mock.patch("overdrive.utils.launch.which", return_value=None), pytest.raises(OSError, match="mpirun"):
        ours.prepare_simple_launcher_cmd_env(args)


def test_tpu_and_config_helpers_are_served_at_accelerates_paths():
    import importlib

    assert callable(importlib.import_module("overdrive.commands.to_fsdp2").load_config)
    assert importlib.import_module("overdrive.utils.launch").which is not None
    launch = importlib.import_module("overdrive.commands.launch")
    assert launch.CHILD_STDERR_CHUNK_SIZE * launch.CHILD_STDERR_TAIL_CHUNKS == 512 * 1024


def test_optimizer_follows_parameters_a_preparation_replaced():
    """Accelerate 1.16's test_remap_optimizer_parameters, on overdrive's Accelerator."""
    from overdrive import Accelerator
    from overdrive.training.state import AcceleratorState, GradientState

    accelerator = Accelerator(mixed_precision="no")
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    old_parameter = model.weight
    old_named = accelerator._get_named_parameters(model)
    assert old_named == {"weight": old_parameter}
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # placement replaces the parameters
    try:
        model = accelerator.prepare_model(model)
        optimizer = accelerator.prepare_optimizer(optimizer)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    accelerator._remap_optimizer_parameters(old_named, model, optimizer)
    assert model.weight is not old_parameter and optimizer.param_groups[0]["params"][0] is model.weight
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(2, 2)).sum())
    optimizer.step()
    torch.testing.assert_close(model.weight, before - 0.2)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
