"""What the command line tells a new user is true: where ``overdrive config`` saved a file and how launch reads
it, and what to add when a script written for Accelerate is launched without ``--as_accelerate``."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from overdrive.cli import Parser, main
from overdrive.cli.launch import add_launch_flags, plan_launch
from tests.support.cli import clean_env, overdrive

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _summary(argv: list[str]) -> str:
    """The first line ``overdrive launch ARGV`` prints (what it will run, and the config file it read)."""
    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    return plan_launch(parser.parse_args(argv))[2]


@pytest.mark.parametrize("where", ["named", "default"])
def test_config_says_how_launch_reads_the_file_it_saved(tmp_path, monkeypatch, capsys, where):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "default_config.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("")
    named = tmp_path / "mine.yaml"
    assert main(["config", "default", *(["--config_file", str(named)] if where == "named" else [])]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    saved = named if where == "named" else tmp_path / "default_config.yaml"
    if where == "named":
        assert said.endswith(f"use it with 'overdrive launch --config_file {named} script.py'"), said
        assert f"config: {named}" not in _summary(["script.py"])  # launch alone does not read it
    else:
        assert said.endswith("'overdrive launch script.py' will use it"), said
    command = said.split("'")[-2] if where == "named" else said.split("'")[1]
    assert _summary(shlex.split(command)[2:]).endswith(f"config: {saved}")  # the command said reads it


def test_one_process_is_not_said_to_be_on_gloo(tmp_path, monkeypatch):
    """``overdrive test`` and ``overdrive launch`` print this line; one process joins no process group."""
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "script.py").write_text("")
    one = _summary(["--cpu", "--num_processes", "1", str(tmp_path / "script.py")])
    assert one.startswith("overdrive launch: starting 1 CPU process (") and "gloo" not in one, one
    assert "2 CPU processes on gloo" in _summary(["--cpu", "--num_processes", "2", str(tmp_path / "script.py")])


# a finder ahead of every other that answers for `accelerate` as Python does for a package that is not installed
_NO_ACCELERATE = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "accelerate" or name.startswith("accelerate."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _launch(tmp_path, *flags: str, shadow: bool = False) -> subprocess.CompletedProcess:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text(  # which engine: the alias' accelerate is a view of overdrive
        "import accelerate\n\nprint('WORKER STARTED', accelerate.Accelerator.__module__.split('.')[0])\n")
    path = [SRC]
    if shadow:
        (tmp_path / "shadow").mkdir()
        (tmp_path / "shadow" / "sitecustomize.py").write_text(_NO_ACCELERATE)
        path.insert(0, str(tmp_path / "shadow"))
    return overdrive("launch", "--num_processes", "1", *flags, "train.py", cwd=tmp_path, timeout=150,
                     env=clean_env(tmp_path, PYTHONPATH=os.pathsep.join(path)))


@pytest.mark.requires("accelerate")
def test_a_script_for_accelerate_without_as_accelerate_is_told_what_runs_it(tmp_path):
    result = _launch(tmp_path)
    assert result.returncode == 0 and "WORKER STARTED accelerate" in result.stdout, result.stderr
    said = [line for line in result.stderr.splitlines() if "--as_accelerate" in line]
    assert said == ["overdrive launch: train.py imports accelerate and the real Accelerate is installed: it runs the "
                    "script, not overdrive; add --as_accelerate to run it on overdrive"], result.stderr


def test_a_script_for_accelerate_without_it_installed_is_told_to_add_as_accelerate(tmp_path):
    result = _launch(tmp_path, shadow=True)
    assert result.returncode == 1 and "No module named 'accelerate'" in result.stderr, result.stderr
    said = [line for line in result.stderr.splitlines() if "--as_accelerate" in line]
    assert said == ["overdrive launch: the script needs Accelerate, which is not installed here: add --as_accelerate "
                    "to run it on overdrive (overdrive launch --as_accelerate ...)"], result.stderr
    fixed = _launch(tmp_path / "again", "--as_accelerate", shadow=True)
    assert fixed.returncode == 0 and "WORKER STARTED overdrive" in fixed.stdout, fixed.stderr  # the alias's
    assert "--as_accelerate" not in fixed.stderr


@pytest.mark.requires("accelerate")
def test_the_start_line_is_left_out_where_overdrive_runs_the_script(tmp_path):
    from overdrive.cli.launch_hints import accelerate_line

    script = tmp_path / "train.py"
    script.write_text("from transformers import Trainer\n")
    assert accelerate_line(str(script)) == (
        "overdrive launch: train.py imports transformers, which runs on Accelerate, and the real Accelerate is "
        "installed: it runs the script, not overdrive; add --as_accelerate to run it on overdrive")
    script.write_text("import overdrive\noverdrive.install_as_accelerate()\nfrom transformers import Trainer\n")
    assert accelerate_line(str(script)) is None  # the script installs the alias itself
    script.write_text("import torch\n")
    assert accelerate_line(str(script)) is None


def test_what_a_library_says_when_accelerate_is_missing_is_recognised():
    from overdrive.launchers.failure_report import needs_accelerate

    transformers = ("ImportError: Using the `Trainer` with `PyTorch` requires `accelerate>=1.1.0`: Please run "
                    "`pip install transformers[torch]` or `pip install 'accelerate>=1.1.0'`")
    assert needs_accelerate(transformers) and needs_accelerate("ModuleNotFoundError: No module named 'accelerate'")
    assert not needs_accelerate("ModuleNotFoundError: No module named 'accelerate_extra'")
