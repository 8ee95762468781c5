"""Compilation as a model transform: ``torch.compile`` applied in place (``module.compile``), so module
names, state-dict keys and checkpoints are the same with and without it.

Regional compilation compiles each repeated block instead of the whole model. The blocks of one class
share their compiled code (dynamo treats their parameters as inputs, not constants), so the cold
compile time grows with the number of distinct block classes, not with the depth of the model.

"In place" means the module's ``forward`` is compiled and its call is not: hooks on the module (autocast,
FSDP2, DeepSpeed) run outside the graph, and modules of torch's own classes (``nn.Sequential``,
``nn.TransformerEncoderLayer``), whose frames ``torch.compile`` skips, are compiled too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from overdrive.runtime import torch_private
from overdrive.transforms.settings import CompileSettings


def apply_compile(model: nn.Module, blocks: list[nn.Module], settings: CompileSettings) -> list[nn.Module]:
    """Compile ``model`` in place (each of ``blocks`` with ``settings.regional``; the whole model when
    there are no blocks or regional compilation is off); return the modules compiled."""
    kwargs = settings.to_kwargs()
    chosen = blocks if settings.regional and blocks else [model]
    for module in chosen:
        _compile_in_place(module, kwargs)
    return chosen


def _compile_in_place(module: nn.Module, kwargs: dict[str, Any]) -> None:
    # The module's forward is compiled, entered through a frame of ours, and its call stays eager: the hooks on
    # it (autocast around the whole model, FSDP2's and DeepSpeed's on blocks) run outside the graph, where
    # their state lives (Module.compile traces them, and the autocast pair then fails). Dynamo also skips
    # the frames of torch's own code, so Module.compile on nn.Sequential or nn.TransformerEncoderLayer would
    # compile nothing; entered from our frame, their forward is inlined. Blocks of one class share the code.
    module.forward = torch.compile(_traced_entry(module.forward), **kwargs)


def _traced_entry(call: Callable[..., Any]) -> Callable[..., Any]:
    def compiled_entry(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    return compiled_entry


def compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module`` itself (not a module inside it) was compiled in place (by ``apply_compile`` or
    ``Module.compile``)."""
    return (hasattr(module.__dict__.get("forward"), "_torchdynamo_orig_callable")
            or torch_private.compiled_in_place(module))


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` (or a module inside it) was compiled in place or wrapped by ``torch.compile``."""
    return any(compiled_in_place(m) or torch_private.compiled_wrapper_inner(m) is not None for m in module.modules())
