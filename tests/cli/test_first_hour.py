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
