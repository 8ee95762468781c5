"""Accelerate's command modules under overdrive, compared with the real Accelerate: the launch parser TRL's
command line drives (same namespace), ``launch_command`` running a script on 2 processes, and the FSDP helpers
PEFT and TRL import (``get_module_class_from_name``, ``get_parameters_from_modules``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from overdrive.compat import cli_launch
from overdrive.compat.fsdp import get_module_class_from_name, get_parameters_from_modules

ARGVS = [
    ["--num_processes", "2", "--mixed_precision", "bf16", "--use_fsdp", "--fsdp_version", "2", "t.py", "--lr", "1"],
    ["--multi-gpu", "--debug", "--num-processes", "4", "-m", "pkg.mod"],
    ["--config_file", "c.yaml", "--zero_stage", "3", "--use_deepspeed", "--fp8_backend", "ao", "t.py"],
    ["--use_parallelism_config", "--parallelism_config_tp_size", "2", "--dynamo_mode", "max-autotune", "t.py"],
]


@pytest.mark.requires("accelerate")
@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(a)[:40])
def test_launch_parser_namespace_equals_accelerates(argv: list[str]) -> None:
    from accelerate.commands.launch import launch_command_parser

    real = vars(launch_command_parser().parse_args(argv))
    ours = vars(cli_launch.launch_command_parser().parse_args(argv))
    assert {k: ours.get(k, "MISSING") for k in real} == real


@pytest.mark.requires("accelerate")
def test_module_helpers_answer_as_accelerate() -> None:
    from accelerate.utils.dataclasses import get_module_class_from_name as real_class
    from accelerate.utils.fsdp_utils import get_parameters_from_modules as real_params

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.LayerNorm(3)))
    for name in ("Linear", "LayerNorm", "ReLU", "Conv2d", "Sequential"):
        assert get_module_class_from_name(model, name) is real_class(model, name), name
    for modules in ("0|2", "2.0", None, [model[0]], "nothing"):
        assert get_parameters_from_modules(modules, model, "cpu") == real_params(modules, model, "cpu"), modules


SCRIPT = """
import json, os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"world": os.environ["WORLD_SIZE"], "mp": os.environ.get("ACCELERATE_MIXED_PRECISION"),
               "arg": sys.argv[2]}, f)
"""


def test_launch_command_runs_the_script_as_trl_calls_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL: ``launch_command(launch_command_parser().parse_args(launch_args + [script] + script_args))``."""
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    args = cli_launch.launch_command_parser().parse_args(
        ["--num_processes", "2", "--mixed_precision", "bf16", "--quiet", str(script), str(tmp_path), "hello"])
    cli_launch.launch_command(args)
    found = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert found == [{"world": "2", "mp": "bf16", "arg": "hello"}] * 2


def test_launch_command_raises_as_accelerate_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "bad.yaml").write_text("invalid_key: 1\nmixed_precision: 'no'\n")
    args = cli_launch.launch_command_parser().parse_args(["--config_file", str(tmp_path / "bad.yaml"), "t.py"])
    with pytest.raises(ValueError, match="invalid_key"):  # Accelerate: ValueError naming the unknown keys
        cli_launch.launch_command(args)


def test_launch_command_under_the_alias_aliases_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command line that reached overdrive through ``import accelerate`` (TRL's) launches scripts whose
    ``import accelerate`` gives overdrive too, as Accelerate's launcher gives them Accelerate."""
    import subprocess
    import sys

    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    script = tmp_path / "train.py"
    script.write_text("import accelerate, os, sys\nopen(os.path.join(sys.argv[1], 'who'), 'w').write("
                      "accelerate.__spec__.name)\n")
    code = ("import overdrive, sys\noverdrive.install_as_accelerate()\n"
            "from accelerate.commands.launch import launch_command, launch_command_parser\n"
            "launch_command(launch_command_parser().parse_args(['--quiet', sys.argv[1], sys.argv[2]]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "who").read_text() == "overdrive"
