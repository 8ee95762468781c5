"""TensorBoard through ``torch.utils.tensorboard`` (needs the ``tensorboard`` package).

Event files go to ``<logging_dir>/<project_name>``; view them with ``tensorboard --logdir <logging_dir>``.
"""

from __future__ import annotations

import os
from typing import Any

from overdrive.tracking.base import (
    GeneralTracker,
    flatten,
    import_required,
    is_number,
    to_python,
    warn_skipped,
)


class TensorBoardTracker(GeneralTracker):
    """Numbers become scalars, strings text, and a dict of numbers one ``add_scalars`` chart. Extra
    keyword arguments go to ``SummaryWriter``; ``init_trackers(config=...)`` is stored as hparams."""

    name = "tensorboard"
    requires_logging_directory = True
    required_packages = (("tensorboard", "tensorboard"),)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **writer_kwargs: Any) -> None:
        self.run_name = run_name
        self.log_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer_kwargs = writer_kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        return self.writer

    def start(self) -> None:
        import_required("tensorboard", "tensorboard", self.name)
        from torch.utils.tensorboard import SummaryWriter  # lazy: optional dependency (tensorboard)

        self.writer = SummaryWriter(self.log_dir, **self.writer_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        hparams = {k: v if isinstance(v, (bool, str)) or is_number(v) else str(v)
                   for k, v in flatten(values).items()}
        # run_name="." keeps the hparams in the same run folder as the scalars
        self.writer.add_hparams(hparams, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = to_python(value)
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, flatten(value), global_step=step, **kwargs)
            elif is_number(value):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            else:
                warn_skipped(self.name, key, value, "numbers, strings or dicts of numbers (use "
                             "get_tracker('tensorboard', unwrap=True) for images, histograms...)")
        self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
