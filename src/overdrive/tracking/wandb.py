"""Weights & Biases (needs ``wandb``).

Run files go under the logging directory when there is one (``<logging_dir>/wandb/...``). Whether the run
syncs to the W&B servers is W&B's own setting: ``WANDB_MODE=offline`` (or
``init_kwargs={"wandb": {"mode": "offline"}}``) keeps everything on disk; sync it later with ``wandb sync``.
"""

from __future__ import annotations

import os
from typing import Any

from overdrive.tracking.base import LibraryRunTracker, import_required


class WandBTracker(LibraryRunTracker):
    """One ``wandb`` run in the W&B project ``project_name``. Keyword arguments (``entity``, ``name``,
    ``mode``, ``tags``...) go to ``wandb.init``; ``log`` keyword arguments to ``run.log``."""

    name = "wandb"
    requires_logging_directory = False
    uses_logging_directory = True
    required_packages = (("wandb", "wandb"),)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = None, **init_kwargs: Any) -> None:
        super().__init__(run_name, **init_kwargs)
        if logging_dir is not None:
            self.init_kwargs.setdefault("dir", os.fspath(logging_dir))

    def start(self) -> None:
        wandb = import_required("wandb", "wandb", self.name)
        if "dir" in self.init_kwargs:
            os.makedirs(self.init_kwargs["dir"], exist_ok=True)
        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)
