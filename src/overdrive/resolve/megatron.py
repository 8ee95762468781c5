"""The resolver's step for ``MegatronLMPlugin``: its field checks plus whether megatron-core can be imported."""

from __future__ import annotations

import importlib.util
from typing import Any


def megatron_core_problem() -> str | None:
    """Why megatron-core cannot be used here, or None."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return ("MegatronLMPlugin needs the 'megatron-core' package, which cannot be imported here; install it with: "
                "pip install megatron-core")
    return None


def check_plugin(plugin: Any, world_size: int, errors: list[str]) -> None:
    """Append the plugin's problems (and megatron-core's absence) to ``errors``. Megatron-LM's own training
    engine (its pipeline schedules and distributed optimizer behind ``prepare()``) is not wired in: a valid
    plugin is reported as such, pointing to the part that works (the model-parallel state)."""
    problems = plugin.problems(world_size)
    problem = megatron_core_problem()
    if problem:
        problems.append(problem)
    if not problems:
        problems.append("training through Megatron-LM's engine is not available in overdrive: set up megatron-core's "
                        "tensor/pipeline groups with overdrive.strategies.megatron.initialize_model_parallel(plugin) "
                        "and build the model with its layers, or use DeepSpeed / FSDP2 with tensor parallelism "
                        "(ParallelismConfig(tp_size=...))")
    errors.extend(f"megatron_lm_plugin: {p}" for p in problems)
