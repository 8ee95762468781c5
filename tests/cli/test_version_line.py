"""``overdrive --version`` names the torch it runs on as torch names itself, build tag included, for any tag."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.cli import clean_env, overdrive

ROOT = Path(__file__).resolve().parents[2]


def test_version_line_names_this_torch_as_torch_names_itself(tmp_path):
    line = overdrive("--version", env=clean_env(tmp_path)).stdout.strip()
    assert line.endswith(f", torch {torch.__version__})")


@pytest.mark.parametrize("tag", ["+cu132", "+rocm6.4", ""])
def test_version_line_keeps_any_build_tag_the_metadata_leaves_out(tmp_path, tag):
    # a torch as the package index ships it: the metadata says 2.15.0, torch.__version__ carries the build tag
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('the version line must not import torch')\n")
    (site / "torch" / "version.py").write_text(f"__all__ = ['__version__']\n__version__ = '2.15.0{tag}'\ncuda = None\n")
    (site / "torch-2.15.0.dist-info").mkdir()
    (site / "torch-2.15.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\n")
    env = clean_env(tmp_path, PYTHONPATH=os.pathsep.join((str(site), str(ROOT / "src"))))
    result = overdrive("--version", env=env)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.strip().endswith(f", torch 2.15.0{tag})")
