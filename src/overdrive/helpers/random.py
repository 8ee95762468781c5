"""Seeding and keeping random number generators in step across processes."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from overdrive.runtime.group import is_distributed, process_rank

# Accelerate's RNG types. "torch" is the CPU generator, "generator" a torch.Generator the caller passes,
# the others an accelerator's default generators (``torch.<type>`` device modules).
_RNG_TYPES = ("torch", "cuda", "xla", "npu", "mlu", "musa", "hpu", "xpu", "generator")


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy and torch (CPU and every accelerator) with ``seed``.

    ``device_specific`` adds the process rank to the seed, so each process draws different numbers (for
    example for data augmentation). ``deterministic`` also calls
    ``torch.use_deterministic_algorithms(True)``.

    >>> set_seed(42)
    """
    if device_specific:
        # before the process group exists (set_seed is often a script's first line) the launcher's rank:
        # torchrun, SLURM or MPI, whichever started this process
        seed += process_rank()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds the CPU and every initialised accelerator (cuda, xpu, mps, ...)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _rng_name(rng_type: Any) -> str:
    name = "torch" if rng_type is None else str(getattr(rng_type, "value", rng_type))
    if name not in _RNG_TYPES:
        raise ValueError(f"rng_type={name!r} is not a known RNG type; use one of {', '.join(_RNG_TYPES)}")
    return name


def _device_module(name: str) -> Any:
    module = getattr(torch, name, None)
    is_available = getattr(module, "is_available", None)
    if module is None or not hasattr(module, "get_rng_state") or is_available is None or not is_available():
        raise RuntimeError(f"cannot synchronize the {name!r} RNG: torch.{name} is not available in this "
                           "process; pass only the RNG types of devices present here")
    return module


def _broadcast_device() -> torch.device:
    """Where the process group can broadcast: the CPU on gloo/mpi, else the current accelerator."""
    backend = str(dist.get_backend())
    if "gloo" in backend or "mpi" in backend or not torch.accelerator.is_available():
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    assert accelerator is not None
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def _get_state(name: str, generator: torch.Generator | None) -> torch.Tensor:
    if name == "torch":
        return torch.get_rng_state()
    if name == "generator":
        if generator is None:
            raise ValueError("rng_type='generator' needs the torch.Generator to synchronize: pass generator=")
        return generator.get_state()
    if name == "xla":
        # lazy: optional dependency
        import torch_xla.core.xla_model as xm  # pyright: ignore[reportMissingImports]  # optional, not in the test extra

        return torch.tensor([xm.get_rng_state()], dtype=torch.int64)
    return _device_module(name).get_rng_state()


def _set_state(name: str, state: torch.Tensor, generator: torch.Generator | None) -> None:
    if name == "torch":
        torch.set_rng_state(state)
    elif name == "generator":
        assert generator is not None
        generator.set_state(state)
    elif name == "xla":
        # lazy: optional dependency
        import torch_xla.core.xla_model as xm  # pyright: ignore[reportMissingImports]  # optional, not in the test extra

        xm.set_rng_state(int(state.item()))
    else:
        _device_module(name).set_rng_state(state)


def synchronize_rng_state(rng_type: Any, generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's state of one RNG: ``"torch"``, an accelerator's (``"cuda"``, ``"xpu"``,
    ...: its device type) or ``"generator"`` (the ``generator`` passed); a name or an ``RNGType``. A no-op
    without a process group of two or more processes.
    """
    name = _rng_name(rng_type)
    if not is_distributed():
        if name == "generator" and generator is None:
            _get_state(name, generator)  # same error as with a process group
        return
    device = _broadcast_device()
    state = _get_state(name, generator).to(device)
    dist.broadcast(state, src=0)
    _set_state(name, state.cpu(), generator)


def synchronize_rng_states(rng_types: Iterable[Any], generator: torch.Generator | None = None) -> None:
    """:func:`synchronize_rng_state` for each of ``rng_types``."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator)
