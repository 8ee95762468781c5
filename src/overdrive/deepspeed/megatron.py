"""Checks for ``MegatronLMPlugin`` and the bridge to ``megatron-core``'s model-parallel state.

megatron-core is optional and imported only here, when asked for. Its GPT model needs CUDA; its parallel
state and tensor-parallel layers also run on CPU processes over gloo.
"""

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


def initialize_model_parallel(plugin: Any) -> Any:
    """Set up megatron-core's tensor / pipeline groups for ``plugin`` over the default process group (which
    must exist); return ``megatron.core.parallel_state``."""
    problem = megatron_core_problem()
    if problem:
        raise ImportError(problem)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=plugin.tp_degree or 1,
                                                 pipeline_model_parallel_size=plugin.pp_degree or 1)
    return parallel_state


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
                        "tensor/pipeline groups with overdrive.deepspeed.megatron.initialize_model_parallel(plugin) "
                        "and build the model with its layers, or use DeepSpeed / FSDP2 with tensor parallelism "
                        "(ParallelismConfig(tp_size=...))")
    errors.extend(f"megatron_lm_plugin: {p}" for p in problems)
