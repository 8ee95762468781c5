"""``extract_model_from_parallel``: the user's module from inside DDP, DataParallel, DeepSpeed and
``torch.compile`` wrappers (``accelerate.utils.extract_model_from_parallel``)."""

from __future__ import annotations

import types
from typing import Any, cast

from torch import nn

from overdrive.runtime.torch_private import compiled_wrapper_inner


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True,
                                keep_torch_compile: bool = True) -> nn.Module:
    """The user's module inside DDP / DataParallel / DeepSpeed wrappers. A ``torch.compile`` wrapper is
    looked through: with ``keep_torch_compile`` (the default) the result is a compiled wrapper of the
    unwrapped module, sharing the original's compile settings (the original is left as it is); otherwise the
    plain module. ``keep_fp32_wrapper=False`` also undoes ``convert_outputs_to_fp32`` on a forward that
    Accelerate-style code saved as ``model._original_forward``."""
    compiled = model if _compiled_inner(model) is not None else None
    model = _compiled_inner(model) or model
    while True:
        inner = getattr(model, "module", None)
        if type(model).__name__ in _WRAPPERS and isinstance(inner, nn.Module):
            model = inner
        elif not keep_torch_compile and _compiled_inner(model) is not None:
            model = _compiled_inner(model) or model
        else:
            break
    if not keep_fp32_wrapper:
        _restore_original_forward(model)
    if compiled is None or not keep_torch_compile:
        return model
    return _recompiled(compiled, model)


def _compiled_inner(model: object) -> nn.Module | None:
    """The module inside a ``torch.compile`` wrapper; None when ``model`` is not one."""
    return compiled_wrapper_inner(model)


def _recompiled(compiled: nn.Module, inner: nn.Module) -> nn.Module:
    """``compiled`` (a ``torch.compile`` wrapper) itself when it wraps ``inner``, else a new compiled wrapper
    of ``inner`` with the same compile settings (``compiled`` is left as it is)."""
    if _compiled_inner(compiled) is inner:
        return compiled
    return type(compiled)(inner, cast(Any, compiled).dynamo_ctx)


def _restore_original_forward(model: nn.Module) -> None:
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    forward = model.forward
    while hasattr(forward, "__wrapped__") and forward != original:
        forward = getattr(forward, "__wrapped__")  # noqa: B009 (functools.wraps sets it)
    function = getattr(forward, "__func__", forward)
    if function is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)  # the class's own forward again
    else:
        model.forward = types.MethodType(function, model)


_WRAPPERS = ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine")
