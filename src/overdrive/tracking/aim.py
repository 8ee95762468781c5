"""Aim (needs ``aim``). The Aim repository is the logging directory: view it with
``aim up --repo <logging_dir>``."""

from __future__ import annotations

import os
from typing import Any

from overdrive.tracking.base import GeneralTracker, flatten, import_required, is_number, plain, warn_skipped


class AimTracker(GeneralTracker):
    """One ``aim.Run`` in the experiment ``project_name``; keyword arguments go to ``aim.Run`` (e.g.
    ``system_tracking_interval=None``); the config is stored as the run's ``hparams``."""

    name = "aim"
    requires_logging_directory = True
    required_packages = (("aim", "aim"),)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **run_kwargs: Any) -> None:
        self.run_name = run_name
        self.repo = os.path.abspath(os.fspath(logging_dir))
        self.run_kwargs = run_kwargs
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        return self.run

    def start(self) -> None:
        aim = import_required("aim", "aim", self.name)
        os.makedirs(self.repo, exist_ok=True)
        self.run = aim.Run(repo=self.repo, experiment=self.run_name, **self.run_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run["hparams"] = plain(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in flatten(values).items():
            if is_number(value):
                self.run.track(value, name=key, step=step, **kwargs)
            else:
                warn_skipped(self.name, key, value, "numbers")

    def finish(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None
