"""Model transforms, each an in-place ``apply_*`` function, wired in a fixed order by ``apply_parallelism``:
tensor / context parallel, then activation checkpointing, then compile, then data parallel (FSDP2).
``transforms.path.apply_model_path`` runs the whole model path (placement, precision hooks, fp8, these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.transforms.path import CompileSettings, ModelTransforms

if TYPE_CHECKING:
    from overdrive.runtime.mesh import ParallelMesh

#: the former name of ``ModelTransforms``
ParallelismSettings = ModelTransforms


def apply_parallelism(model: nn.Module, mesh: ParallelMesh, config: ModelTransforms) -> nn.Module:
    """Apply every parallelism ``config`` asks for to ``model``, in place, over ``mesh``."""
    from overdrive.transforms import fully_shard as dp
    from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing
    from overdrive.transforms.blocks import blocks_to_wrap
    from overdrive.transforms.compile import apply_compile
    from overdrive.transforms.tensor_parallel import apply_tensor_parallel, match_blocks, plan_from_patterns

    tp_mesh = mesh.get("tp")
    if tp_mesh is not None:
        plan = (plan_from_patterns(model, config.tp_plan, config.sequence_parallel, tp_mesh.size()) if config.tp_plan
                else match_blocks(model, tp_mesh.size(), config.sequence_parallel))
        apply_tensor_parallel(model, tp_mesh, plan)
    # Context parallel changes no module: attention is split while ``maybe_context_parallel`` is open.
    blocks = blocks_to_wrap(model, list(config.block_names) or config.fsdp.transformer_cls_names_to_wrap)
    if config.activation_checkpointing:
        if not blocks:
            raise ValueError(f"activation_checkpointing found no blocks in {type(model).__name__}; name their "
                             "classes (ActivationCheckpointingKwargs(block_names=[...]) or "
                             "transformer_cls_names_to_wrap)")
        apply_activation_checkpointing(blocks)
    if config.compile is not None:
        apply_compile(model, blocks, config.compile)
    fsdp_mesh = mesh.fsdp_mesh()
    if fsdp_mesh is not None:
        settings = dp.FullyShardSettings(
            reshard_after_forward=config.fsdp.reshard,
            mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision),
            root_mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision, root=True),
            offload_policy=dp.offload_policy(config.fsdp),
            wrap=dp.wrap_policy(config.fsdp, model, blocks),
            ignored_params=dp.ignored_parameters(config.fsdp, model))
        dp.apply_fully_shard(model, fsdp_mesh, settings)
    return model


__all__ = ["CompileSettings", "ModelTransforms", "ParallelismSettings", "apply_parallelism"]
