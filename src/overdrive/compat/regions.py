"""Accelerate's regional-compilation helpers (``accelerate.utils.other``), for code that calls them itself.

The Accelerator compiles regions on its own (``TorchDynamoPlugin(use_regional_compilation=True)``, in place,
``overdrive.transforms.compile``). These are the functions Accelerate exposes, with its results:
``compile_regions`` returns a new model whose repeated blocks are ``torch.compile`` wrappers (the original
model is left as it was, and kept as ``_orig_mod``); the DeepSpeed and FSDP2 forms compile in place.
"""

from __future__ import annotations

import copy
import functools
from types import MethodType
from typing import Any, TypeGuard, cast

import torch
from torch import nn


def is_repeated_blocks(module: nn.Module) -> TypeGuard[nn.ModuleList]:
    """Whether ``module`` is a non-empty ``nn.ModuleList`` whose children are all of the first one's class."""
    if not isinstance(module, nn.ModuleList) or len(module) == 0:
        return False
    first = type(module[0])
    return all(isinstance(child, first) for child in module)


def has_repeated_blocks(module: nn.Module) -> bool:
    """Whether ``module`` or a module inside it is a list of repeated blocks (``is_repeated_blocks``)."""
    return any(is_repeated_blocks(m) for m in module.modules())


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """A copy of ``module`` whose repeated blocks are each ``torch.compile(block, **compile_kwargs)`` (blocks of
    one class share the compiled code), the other leaves compiled whole. The containers above the blocks are
    shallow copies of the originals, sharing parameters with them; methods bound to an original (a
    ``forward`` set on the instance) are bound to its copy. The original is the result's ``_orig_mod``::

        compiled = compile_regions(model, backend="inductor")
        compiled.layers[0]  # OptimizedModule(_orig_mod=Block(...))
    """
    compiled = _compile_regions(module, compile_kwargs)
    compiled.__dict__.setdefault("_orig_mod", module)  # unwrap_model / extract_model_from_parallel find it
    return compiled


def _compile_regions(module: nn.Module, compile_kwargs: dict[str, Any]) -> nn.Module:
    if is_repeated_blocks(module):
        return nn.ModuleList([_compile_block(block, compile_kwargs) for block in module])
    if not has_repeated_blocks(module):
        return cast(nn.Module, torch.compile(module, **compile_kwargs))
    twin = type(module).__new__(type(module))
    twin.__dict__.update(module.__dict__)
    _rebind(module, twin)
    twin._modules = {}
    for name, child in module.named_children():
        twin.add_module(name, _compile_regions(child, compile_kwargs))
    return twin


def _compile_block(block: nn.Module, compile_kwargs: dict[str, Any]) -> nn.Module:
    """``torch.compile`` over a shallow copy of ``block`` whose own call is compiled too: a block that wraps
    its ``__call__`` (activation checkpointing, as transformers' ``GradientCheckpointingLayer``) makes the
    outer graph break, and the inner compiled call is what still runs compiled (as in Accelerate)."""
    twin = copy.copy(block)
    _rebind(block, twin)
    twin.compile(**compile_kwargs)
    return cast(nn.Module, torch.compile(twin, **compile_kwargs))


def _rebind(module: nn.Module, twin: nn.Module) -> None:
    """Methods and partials bound to ``module`` (``model.forward = MethodType(...)``, a hook's partial) would
    run on the original's state (its children, its training flag): bind them to ``twin``."""
    def rebind(value: Any) -> Any:
        if isinstance(value, MethodType) and value.__self__ is module:
            return MethodType(value.__func__, twin)
        if isinstance(value, functools.partial):
            args = tuple(twin if arg is module else arg for arg in value.args)
            keywords = {key: twin if arg is module else arg for key, arg in value.keywords.items()}
            rebound = functools.partial(rebind(value.func), *args, **keywords)
            rebound.__dict__.update(value.__dict__)
            return rebound
        return value

    for name, value in list(twin.__dict__.items()):
        twin.__dict__[name] = rebind(value)


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """Regional compilation in place (``Module.compile`` on each repeated block, and on the leaves outside
    them), as Accelerate does for the module inside a DeepSpeed engine."""
    _compile_regions_in_place(module, compile_kwargs)


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Regional compilation in place (as ``compile_regions_deepspeed``), so the hooks ``fully_shard`` adds
    afterwards still run; returns ``module``."""
    _compile_regions_in_place(module, compile_kwargs)
    return module


def _compile_regions_in_place(module: nn.Module, compile_kwargs: dict[str, Any]) -> None:
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            _compile_regions_in_place(child, compile_kwargs)
    else:
        module.compile(**compile_kwargs)
