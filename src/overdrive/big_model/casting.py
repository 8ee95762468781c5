"""Layerwise casting: weights stored in a small dtype (fp8, bf16) and cast up for each layer's forward.

Accelerate's ``LayerwiseCastingHook`` / ``attach_layerwise_casting_hooks``: memory holds the storage dtype;
a leaf layer (Linear, Conv) is cast to the compute dtype just before its forward and back right after.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from overdrive.big_model.hooks import ModelHook, add_hook_to_module

__all__ = ["LayerwiseCastingHook", "attach_layerwise_casting_hooks", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING"]

SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                                          nn.ConvTranspose3d, nn.Linear)


class LayerwiseCastingHook(ModelHook):
    """Keep ``module`` in ``storage_dtype``; run its forward in ``compute_dtype``."""

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | tuple[str, ...] | None = None,
                                   skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False) -> None:
    """Cast every Linear / Conv layer of ``module`` this way (other layers, e.g. norms, keep their dtype, as in
    Accelerate), except layers whose name matches a ``skip_modules_pattern`` regex or whose class is skipped.

    Example:
        >>> attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.bfloat16, skip_modules_pattern=("norm",))
    """
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern
    _attach(module, storage_dtype, compute_dtype, patterns, skip_modules_classes, non_blocking, "")


def _attach(module: nn.Module, storage: torch.dtype, compute: torch.dtype, patterns: tuple[str, ...] | None,
            classes: tuple[type[nn.Module], ...] | None, non_blocking: bool, prefix: str) -> None:
    if (classes is not None and isinstance(module, classes)) or (
            patterns is not None and any(re.search(p, prefix) for p in patterns)):
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        add_hook_to_module(module, LayerwiseCastingHook(storage, compute, non_blocking), append=True)
        return
    for name, child in module.named_children():
        _attach(child, storage, compute, patterns, classes, non_blocking, f"{prefix}.{name}" if prefix else name)
