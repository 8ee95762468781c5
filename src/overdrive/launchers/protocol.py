"""The launch handoff: how ``overdrive launch`` (and the notebook launcher) pass their resolved settings to
each worker: one JSON object in one environment variable, written by the launcher and read by the resolver.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

#: The launcher hands its resolved settings to each worker in this one variable, as JSON.
LAUNCH_CONFIG_VAR = "OVERDRIVE_LAUNCH_CONFIG"
#: The launcher's process id, so that a worker can die with it (``overdrive.launchers.worker``).
LAUNCHER_PID_VAR = "OVERDRIVE_LAUNCHER_PID"
#: Every variable of Accelerate's that the resolver reads starts with one of these (a test checks the schema):
#: without one, the schema (costly to import) is not loaded at all.
ACCELERATE_PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_", "OVERDRIVE_FT_")


def launch_config() -> dict[str, Any]:
    """The settings ``overdrive launch`` resolved for this worker, over those of Accelerate's variables
    (``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_CPU``, ...: set by ``accelerate launch`` or by hand);
    empty when started another way."""
    from_accelerate: dict[str, Any] = {}
    if any(name.startswith(ACCELERATE_PREFIXES) for name in os.environ):
        from overdrive.config.accelerate_env import settings_from_environment

        from_accelerate = settings_from_environment(os.environ)
    raw = os.environ.get(LAUNCH_CONFIG_VAR)
    if not raw:
        return from_accelerate
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{LAUNCH_CONFIG_VAR} is not valid JSON ({exc}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{LAUNCH_CONFIG_VAR} must hold a JSON object, got {raw[:200]!r}")
    return {**from_accelerate, **value}


def encode_launch_config(config: Mapping[str, Any]) -> str:
    """``config`` as the value of ``LAUNCH_CONFIG_VAR`` (JSON, keys sorted so equal configs read equal)."""
    return json.dumps(dict(config), sort_keys=True)
