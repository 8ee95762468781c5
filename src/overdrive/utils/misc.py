"""Small helpers users import from ``accelerate.utils``."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch import nn

from overdrive.runtime import group


def is_package_available(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    return importlib.util.find_spec(name) is not None


def wait_for_everyone() -> None:
    """Barrier across every process (a no-op in a single process)."""
    if group.is_distributed():
        dist.barrier()


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True,
                                keep_torch_compile: bool = True) -> nn.Module:
    """The user's module inside DDP / DeepSpeed wrappers (and torch.compile's unless kept)."""
    while True:
        inner = getattr(model, "module", None)
        compiled = None if keep_torch_compile else getattr(model, "_orig_mod", None)
        if type(model).__name__ in _WRAPPERS and isinstance(inner, nn.Module):
            model = inner
        elif isinstance(compiled, nn.Module):
            model = compiled
        else:
            return model


_WRAPPERS = ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine")


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (names upper-cased; ``None`` removes one) for the block, restoring them
    afterwards."""
    saved = {key.upper(): os.environ.get(key.upper()) for key in kwargs}
    try:
        for key, value in kwargs.items():
            _set_env(key.upper(), None if value is None else str(value))
        yield
    finally:
        for key, value in saved.items():
            _set_env(key, value)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm`` shown on the main process only (others get a disabled bar)."""
    from tqdm.auto import tqdm as _tqdm

    if main_process_only and group.rank() != 0:
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
