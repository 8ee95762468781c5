"""Accelerate's launch-config helpers (``accelerate.commands.config`` and ``accelerate.utils``): the default
config file's path, reading a config file as Accelerate's record of it, writing a basic one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from overdrive.compat.cli_commands import config_record
from overdrive.config.choices import invalid_choice
from overdrive.launchers import config_file as cf
from overdrive.launchers.settings import MIXED_PRECISION


def _default_config_file() -> str:
    """The default config file's path, read when called (``default_config_file`` is its value at import)."""
    return str(cf.default_config_path())


default_config_file = _default_config_file()


def load_config_from_file(config_file: str | os.PathLike | None = None) -> Any:
    """The launch config (``config_file``, else the default one) as Accelerate's record of it: a
    ``ClusterConfig``, or a ``SageMakerConfig`` for ``compute_environment: AMAZON_SAGEMAKER``."""
    source = cf.find_config(config_file)
    if source.path is None or not source.path.is_file():
        raise FileNotFoundError(f"no launch config file at {config_file or source.describe()}; "
                                "write one with 'overdrive config' or write_basic_config()")
    return config_record(cf.load_config(source.path))


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike | None = None) -> Path | bool:
    """Write a one-machine config file using every local device (``overdrive config default``); returns
    its path, or False (and changes nothing) when a file is already there."""
    path = Path(save_location or cf.default_config_path()).expanduser()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `overdrive config` or pass "
              "another save_location.")
        return False
    precision = str(mixed_precision).lower()
    if precision not in MIXED_PRECISION:
        raise ValueError(invalid_choice(f"mixed_precision={mixed_precision!r}", mixed_precision, MIXED_PRECISION))
    count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
    accelerator = torch.accelerator.current_accelerator() if count else None
    kind = accelerator.type if accelerator is not None else "cpu"
    return cf.save_config(cf.basic_config(precision, device_count=count, device_type=kind), path)
