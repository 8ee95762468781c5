"""Cluster environments: read a process's rank and world from what its launcher set.

Each environment is a function that returns a ``ProcessInfo`` or ``None`` when its variables are absent;
``detect_process_info`` asks them in order. A new cluster manager is one more function in ``DETECTORS``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    restart_count: int = 0
    # torchrun's agent already hosts the TCPStore at MASTER_ADDR:MASTER_PORT; otherwise rank 0 hosts it.
    agent_store: bool = False
    source: str = "single process"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


def from_torchrun(env: Mapping[str, str]) -> ProcessInfo | None:
    """torchrun / TorchElastic, or anything that sets the same variables (RANK, WORLD_SIZE, ...)."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = _int(env, "WORLD_SIZE", 1)
    return ProcessInfo(
        rank=_int(env, "RANK", 0),
        world_size=world,
        local_rank=_int(env, "LOCAL_RANK", 0),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
        node_rank=_int(env, "GROUP_RANK", 0),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500),
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        source="torchelastic" if "TORCHELASTIC_RUN_ID" in env else "environment (RANK/WORLD_SIZE)",
    )


DETECTORS: list[Callable[[Mapping[str, str]], ProcessInfo | None]] = [from_torchrun]


def detect_process_info(env: Mapping[str, str] | None = None) -> ProcessInfo:
    """The first cluster environment that recognises ``env`` (default: ``os.environ``), else one process."""
    env = os.environ if env is None else env
    for detect in DETECTORS:
        info = detect(env)
        if info is not None:
            return info
    return ProcessInfo()
