"""What a new user meets in the first hour: ``overdrive --version``, ``doctor``, ``env``, ``config`` at the end of
its input, ``merge-weights`` and ``to-fsdp2`` on mistakes, and the help texts."""

from __future__ import annotations

import torch

import overdrive as package
from overdrive.compat.table import ACCELERATE_VERSION
from test_cli import clean_env, overdrive


def test_version_names_overdrive_the_accelerate_api_and_torch(tmp_path):
    expected = f"overdrive {package.__version__} (Accelerate API {ACCELERATE_VERSION}, torch {torch.__version__})"
    for flag in ("--version", "-V"):
        result = overdrive(flag, env=clean_env(tmp_path))
        assert (result.returncode, result.stdout.strip(), result.stderr) == (0, expected, "")
    assert "--version" in overdrive("--help", env=clean_env(tmp_path)).stdout


def test_env_reports_what_accelerates_does_and_the_libraries(tmp_path):
    import subprocess
    import sys
    from importlib import metadata

    ours = overdrive("env", env=clean_env(tmp_path)).stdout
    theirs = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "env"], capture_output=True,
                            text=True, timeout=120, env=clean_env(tmp_path)).stdout
    ram = next(line for line in theirs.splitlines() if line.startswith("- System RAM:"))
    assert f"- System RAM: {ram.split()[-2]} GiB (" in ours  # the same figure as Accelerate's (it says GB)
    for theirs_line, ours_line in (("- Platform:", "- Platform:"), ("- Python version:", "- Python version:"),
                                   ("- Numpy version:", "- numpy version:"), ("- PyTorch version:", "- PyTorch version:"),
                                   ("bash location", "- `overdrive` command:"), ("default config", "- Config file:")):
        assert theirs_line in theirs and ours_line in ours
    for name in ("transformers", "deepspeed", "torchao", "safetensors", "accelerate"):
        assert f"{name} {metadata.version(name)}" in ours


def test_config_at_the_end_of_its_input_writes_nothing(tmp_path):
    target = tmp_path / "asked.yaml"
    for answers in ("", "1\n\n"):  # no answer at all; the input ends half-way (Ctrl-D, a short pipe)
        result = overdrive("config", "--config_file", str(target), env=clean_env(tmp_path), stdin=answers)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "overdrive config: error: the input ended before an answer to " in result.stderr
        assert "nothing was written" in result.stderr and not target.exists()
