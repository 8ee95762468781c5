"""Compat path: the progress bar lives in ``overdrive.tracking.progress``."""

from overdrive.tracking.progress import ProgressBar, progress_bar

__all__ = ["ProgressBar", "progress_bar"]
