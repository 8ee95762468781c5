"""Model transforms, each an in-place ``apply_*`` function, run as the named steps of the model path
(``transforms.path.ModelPath``: placement, precision hooks, fp8, parallelize, activation checkpointing,
compile, data parallel); ``register_step`` adds a transform's own step to every strategy's path. The built-in
steps' settings are plain values in ``transforms.settings``."""

from __future__ import annotations

from overdrive.transforms.path import STEPS, ModelPath, PathStep, register_step, remove_step, step_names
from overdrive.transforms.settings import CompileSettings, ModelTransforms

__all__ = ["STEPS", "CompileSettings", "ModelPath", "ModelTransforms", "PathStep", "register_step", "remove_step",
           "step_names"]
