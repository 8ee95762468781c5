"""Checks for ``MegatronLMPlugin`` and the bridge to ``megatron-core``'s model-parallel state.

megatron-core is optional and imported only here, when asked for. Its GPT model needs CUDA; its parallel
state and tensor-parallel layers also run on CPU processes over gloo.
"""

from __future__ import annotations

import importlib.util
from typing import Any

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WEIGHT_DECAY_STYLES = ("constant", "linear", "cosine")


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


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def plugin_problems(plugin: Any, world_size: int | None = None) -> list[str]:
    """Every invalid field of a MegatronLMPlugin, each naming the value and the valid choices."""
    found = []
    for name in ("tp_degree", "pp_degree", "num_micro_batches", "num_layers_per_virtual_pipeline_stage"):
        value = getattr(plugin, name)
        if value is not None and not _positive(value):
            found.append(f"{name}={value!r} is not valid; it must be an integer >= 1")
    tp = plugin.tp_degree if _positive(plugin.tp_degree) else 1
    pp = plugin.pp_degree if _positive(plugin.pp_degree) else 1
    if plugin.sequence_parallelism and tp == 1:
        found.append("sequence_parallelism=True splits activations across the tensor-parallel group, which needs "
                     f"tp_degree > 1 (tp_degree={plugin.tp_degree!r})")
    if plugin.num_layers_per_virtual_pipeline_stage is not None and pp == 1:
        found.append(f"num_layers_per_virtual_pipeline_stage={plugin.num_layers_per_virtual_pipeline_stage!r} "
                     f"interleaves pipeline stages, which needs pp_degree > 1 (pp_degree={plugin.pp_degree!r})")
    if plugin.pipeline_model_parallel_split_rank is not None and pp == 1:
        found.append("pipeline_model_parallel_split_rank needs pp_degree > 1")
    clip = plugin.gradient_clipping
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        found.append(f"gradient_clipping={clip!r} is not valid; give a number >= 0")
    if plugin.lr_decay_style not in LR_DECAY_STYLES:
        found.append(f"lr_decay_style={plugin.lr_decay_style!r} is not valid; choose one of {list(LR_DECAY_STYLES)}")
    if plugin.weight_decay_incr_style not in WEIGHT_DECAY_STYLES:
        found.append(f"weight_decay_incr_style={plugin.weight_decay_incr_style!r} is not valid; choose one of "
                     f"{list(WEIGHT_DECAY_STYLES)}")
    for name in ("custom_model_provider_function", "custom_prepare_model_function", "custom_get_batch_function",
                 "custom_loss_function", "custom_megatron_datasets_provider_function"):
        value = getattr(plugin, name)
        if value is not None and not callable(value):
            found.append(f"{name}={value!r} is not callable")
    if world_size is not None and world_size % (tp * pp):
        found.append(f"tp_degree x pp_degree = {tp} x {pp} = {tp * pp} does not divide the {world_size} processes; "
                     "the data-parallel degree is the processes divided by that product")
    return found


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
