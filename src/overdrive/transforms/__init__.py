"""Model transforms, each an in-place ``apply_*`` function, wired in a fixed order by ``apply_parallelism``:
tensor / context parallel, then activation checkpointing, then compile, then data parallel (FSDP2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.precision import PrecisionPolicy

if TYPE_CHECKING:
    from overdrive.runtime.mesh import ParallelMesh


@dataclass
class ParallelismSettings:
    """What to do to a model, independent of the model: the strategy builds it from the plan."""

    tp_plan: dict[str, str] | None = None
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    compile_backend: str | None = None
    fsdp: FullyShardedDataParallelPlugin = field(default_factory=FullyShardedDataParallelPlugin)
    precision: PrecisionPolicy = field(default_factory=PrecisionPolicy)


def apply_parallelism(model: nn.Module, mesh: ParallelMesh, config: ParallelismSettings) -> nn.Module:
    """Apply every parallelism ``config`` asks for to ``model``, in place, over ``mesh``."""
    from overdrive.transforms import fully_shard as dp
    from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing
    from overdrive.transforms.blocks import blocks_to_wrap
    from overdrive.transforms.tensor_parallel import apply_tensor_parallel, match_blocks, plan_from_patterns

    tp_mesh = mesh.get("tp")
    if tp_mesh is not None:
        plan = (plan_from_patterns(model, config.tp_plan, config.sequence_parallel, tp_mesh.size()) if config.tp_plan
                else match_blocks(model, tp_mesh.size(), config.sequence_parallel))
        apply_tensor_parallel(model, tp_mesh, plan)
    # Context parallel changes no module: attention is split while ``maybe_context_parallel`` is open.
    blocks = blocks_to_wrap(model, config.fsdp.transformer_cls_names_to_wrap)
    if config.activation_checkpointing:
        if not blocks:
            raise ValueError(f"activation_checkpointing found no blocks in {type(model).__name__}; name them with "
                             "transformer_cls_names_to_wrap")
        apply_activation_checkpointing(blocks)
    if config.compile_backend:
        for block in blocks or [model]:
            block.compile(backend=config.compile_backend)  # in place: names (and checkpoints) stay the same
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


__all__ = ["ParallelismSettings", "apply_parallelism"]
