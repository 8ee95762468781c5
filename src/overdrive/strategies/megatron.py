"""The bridge to ``megatron-core``'s model-parallel state for a ``MegatronLMPlugin``.

megatron-core is optional and imported only here, when asked for. Its GPT model needs CUDA; its parallel
state and tensor-parallel layers also run on CPU processes over gloo.
"""

from __future__ import annotations

from typing import Any

from overdrive.resolve.megatron import megatron_core_problem


def initialize_model_parallel(plugin: Any) -> Any:
    """Set up megatron-core's tensor / pipeline groups for ``plugin`` over the default process group (which
    must exist); return ``megatron.core.parallel_state``."""
    problem = megatron_core_problem()
    if problem:
        raise ImportError(problem)
    # lazy: optional dependency
    from megatron.core import parallel_state  # pyright: ignore[reportMissingImports]  # optional, not in the test extra

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=plugin.tp_degree or 1,
                                                 pipeline_model_parallel_size=plugin.pp_degree or 1)
    return parallel_state
