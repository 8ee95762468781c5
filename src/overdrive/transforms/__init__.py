"""Model transforms, each an ``apply_*`` function with explicit arguments that a strategy's ``wrap_model``
calls in one fixed order (``transforms/path.py``: placement, precision hooks, fp8, tensor parallel, activation
checkpointing, compile, data parallel). Their settings are plain values in ``transforms.settings``."""

from __future__ import annotations

from overdrive.transforms.settings import CompileSettings, ModelTransforms

__all__ = ["CompileSettings", "ModelTransforms"]
