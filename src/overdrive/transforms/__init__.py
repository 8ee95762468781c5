"""Model transforms, each an in-place ``apply_*`` function, wired in a fixed order by ``apply_parallelism``:
tensor / context parallel, then activation checkpointing, then compile, then data parallel (FSDP2).
``transforms.path.apply_model_path`` runs the whole model path (placement, precision hooks, fp8, these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.transforms.path import CompileSettings, ModelTransforms, apply_parallelism

if TYPE_CHECKING:
    from overdrive.runtime.mesh import ParallelMesh

#: the former name of ``ModelTransforms``
ParallelismSettings = ModelTransforms




__all__ = ["CompileSettings", "ModelTransforms", "ParallelismSettings", "apply_parallelism"]
