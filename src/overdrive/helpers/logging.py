"""Loggers that know about processes: log once from the main process, or from every process in rank order.

    from overdrive.helpers.logging import get_logger
    logger = get_logger(__name__, log_level="INFO")
    logger.info("starting")                                          # rank 0 only
    logger.info("my shard has %d rows", n, main_process_only=False)  # every rank
    logger.info("rank report", main_process_only=False, in_order=True)  # every rank, in rank order
"""

from __future__ import annotations

import logging  # the standard library's: absolute imports never pick up this module
import os
from collections.abc import Hashable
from typing import Any

_LOG_LEVEL_VARS = ("OVERDRIVE_LOG_LEVEL", "ACCELERATE_LOG_LEVEL")
_warned_once: set[Hashable] = set()


def _rank_and_world() -> tuple[int, int]:
    from overdrive.runtime.group import rank, world_size  # lazy: imports torch, only once something is logged

    return rank(), world_size()


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``logging.LoggerAdapter`` whose calls take ``main_process_only`` (default True: only rank 0 logs)
    and ``in_order`` (with ``main_process_only=False``: ranks log one after another, in rank order).

    ``in_order`` is a collective (a barrier per rank): every rank must make the same call, and the logger's
    level must be the same on every rank.
    """

    def log(self, level: int, msg: Any, *args: Any, main_process_only: bool = True, in_order: bool = False,
            **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        kwargs.setdefault("stacklevel", 2)  # attribute the record to the caller, not to this method
        rank, world = _rank_and_world()
        if in_order and not main_process_only and world > 1:
            # lazy: this module stays torch-free: the launcher logs before torch is imported
            import torch.distributed as dist

            for turn in range(world):
                if turn == rank:
                    msg, processed = self.process(msg, kwargs)
                    self.logger.log(level, msg, *args, **processed)
                dist.barrier()
            return
        if rank == 0 or not main_process_only:
            msg, processed = self.process(msg, kwargs)
            self.logger.log(level, msg, *args, **processed)

    def warning_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """``warning``, but a given message (with the same arguments) is logged only once per process."""
        key: Hashable = (self.logger.name, msg, args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            key = repr(key)
        if key in _warned_once:
            return
        _warned_once.add(key)
        kwargs.setdefault("stacklevel", 3)  # past this method too
        self.warning(msg, *args, **kwargs)


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A :class:`MultiProcessAdapter` over ``logging.getLogger(name)``.

    ``log_level`` (a name such as ``"INFO"`` or a number) sets the logger's level; when not given, the
    ``OVERDRIVE_LOG_LEVEL`` or ``ACCELERATE_LOG_LEVEL`` environment variable does, if set.
    """
    if log_level is None:
        log_level = next((os.environ[var] for var in _LOG_LEVEL_VARS if os.environ.get(var)), None)
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
    return MultiProcessAdapter(logger, {})


# the library's loggers: Accelerate's names ("accelerate.*"), and overdrive's own modules ("overdrive.*")
_LIBRARY_LOGGERS = ("accelerate", "overdrive")


def get_verbosity() -> int:
    """The effective level of the library's logger (``logging.getLogger("accelerate")``), as a number."""
    return logging.getLogger("accelerate").getEffectiveLevel()


def set_verbosity(verbosity: int | str) -> None:
    """Set the level of the library's loggers (``"accelerate"`` and overdrive's own ``"overdrive"``): a number
    such as ``logging.WARNING`` or a level name in any case (``"warning"``). Loggers given their own level
    (``get_logger(name, log_level=...)``, ``ACCELERATE_LOG_LEVEL``) keep it; the root logger is left alone."""
    level = verbosity.upper() if isinstance(verbosity, str) else verbosity
    for name in _LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def set_verbosity_debug() -> None:
    """``set_verbosity(logging.DEBUG)``."""
    set_verbosity(logging.DEBUG)


def set_verbosity_info() -> None:
    """``set_verbosity(logging.INFO)``."""
    set_verbosity(logging.INFO)


def set_verbosity_warning() -> None:
    """``set_verbosity(logging.WARNING)``."""
    set_verbosity(logging.WARNING)


def set_verbosity_error() -> None:
    """``set_verbosity(logging.ERROR)``."""
    set_verbosity(logging.ERROR)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm`` shown on the main process only (others get a disabled bar)."""
    from tqdm.auto import tqdm as _tqdm  # lazy: every logger user would pay for tqdm; only a bar needs it

    if main_process_only and _rank_and_world()[0] != 0:
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
