"""Accelerate's environment helpers (``accelerate.utils.environment``), for user code that calls them.

These read variables because reading one is what the caller asked for; overdrive itself reads its
settings only in the resolver.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

__all__ = ["str_to_bool", "get_int_from_env", "parse_flag_from_env", "parse_choice_from_env",
           "are_libraries_initialized", "get_current_device_type", "get_gpu_info", "check_cuda_p2p_ib_support",
           "check_cuda_fp8_capability", "set_numa_affinity", "clear_environment", "patch_environment",
           "purge_accelerate_environment", "convert_dict_to_env_variables", "get_cpu_distributed_information"]

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1/0 (or True/False with ``to_bool``) for a yes/no word; ``ValueError`` naming the word otherwise."""
    word = str(value).strip().lower()
    if word in _TRUE:
        return True if to_bool else 1
    if word in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: use one of {', '.join(_TRUE + _FALSE)}")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first non-negative integer among the variables ``env_keys``, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The variable ``key`` as a yes/no value (``default`` when unset)."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The variable ``key`` as it is, or ``default``."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of this machine's accelerator, without initialising it."""
    import torch  # lazy: this module stays torch-free: the environment helpers run before torch is needed

    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    kind = accelerator.type if accelerator is not None else "cuda"
    return kind, "MULTI_GPU" if kind == "cuda" else f"MULTI_{kind.upper()}"


def get_gpu_info() -> tuple[list[str], int]:
    """Names and count of the CUDA devices (empty on a machine without them)."""
    import torch  # lazy: this module stays torch-free: the environment helpers run before torch is needed

    if not torch.cuda.is_available():
        return [], 0
    count = torch.cuda.device_count()
    return [torch.cuda.get_device_name(i) for i in range(count)], count


def check_cuda_p2p_ib_support() -> bool:
    """False when several consumer RTX 40xx GPUs are present (their P2P/IB is known broken), else True."""
    names, count = get_gpu_info()
    return not (count > 1 and any("RTX 40" in name for name in names))


def check_cuda_fp8_capability() -> bool:
    """Whether the CUDA device can run fp8 (compute capability 8.9 or newer)."""
    import torch  # lazy: this module stays torch-free: the environment helpers run before torch is needed

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Not applied by overdrive (torchrun's ``--numa-binding`` does it): a no-op kept for callers."""
    return None


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``, restoring it afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
            os.environ.pop(key)
        os.environ.update(saved)


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: ``ACCELERATE_*`` variables the function (or each ``test*`` method of the class, and of
    every subclass defined later) sets are removed after it, and changed ones restored."""
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)
    _purge_test_methods(func_or_cls)
    earlier = func_or_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:  # noqa: N807 (the hook's own name)
        if isinstance(earlier, classmethod):
            earlier.__func__(cls, **kwargs)
        else:
            super(func_or_cls, cls).__init_subclass__(**kwargs)
        _purge_test_methods(cls)

    func_or_cls.__init_subclass__ = classmethod(__init_subclass__)  # pyright: ignore[reportAttributeAccessIssue]
    return func_or_cls


def _purging(function: Callable) -> Callable:
    if getattr(function, "_accelerate_is_purged_environment_wrapped", False):
        return function

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _accelerate_variables_restored():
            return function(*args, **kwargs)

    wrapper._accelerate_is_purged_environment_wrapped = True  # pyright: ignore[reportAttributeAccessIssue]
    return wrapper


def _purge_test_methods(cls: type) -> None:
    for name in dir(cls):
        if name.startswith("test") and callable(getattr(cls, name)):
            setattr(cls, name, _purging(getattr(cls, name)))


def convert_dict_to_env_variables(current_env: dict[str, Any]) -> list[str]:
    """``KEY=value`` lines for the entries with a non-empty key and value free of ``; \\n < >`` and spaces;
    each other entry is skipped with a warning (on the logger ``accelerate.utils.environment``)."""
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if str(key) and str(value) and not any(c in text for c in _FORBIDDEN_IN_ENV):
            lines.append(f"{key}={value}\n")
        else:
            _LOGGER.warning("Skipping the variable %s=%r: a name and a value are needed, and neither may contain "
                            "';', a newline, '<', '>' or a space", key, value)
    return lines


_FORBIDDEN_IN_ENV = (";", "\n", "<", ">", " ")
#: Accelerate's logger name for this module, which its users and tests watch
_LOGGER = logging.getLogger("accelerate.utils.environment")


def get_cpu_distributed_information() -> Any:
    """rank, world_size, local_rank, local_world_size of this CPU process, from the launcher's variables."""
    return SimpleNamespace(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )


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
