"""Compilation as a model transform: ``torch.compile`` applied in place (``module.compile``), so module
names, state-dict keys and checkpoints are the same with and without it.

Regional compilation compiles each repeated block instead of the whole model. The blocks of one class
share their compiled code (dynamo treats their parameters as inputs, not constants), so the cold
compile time grows with the number of distinct block classes, not with the depth of the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from overdrive.transforms.path import CompileSettings


def apply_compile(model: nn.Module, blocks: list[nn.Module], settings: CompileSettings) -> list[nn.Module]:
    """Compile ``model`` in place (each of ``blocks`` with ``settings.regional``; the whole model when
    there are no blocks or regional compilation is off); return the modules compiled."""
    kwargs = settings.to_kwargs()
    chosen = blocks if settings.regional and blocks else [model]
    for module in chosen:
        module.compile(**kwargs)
    return chosen


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` (or a module inside it) was compiled in place or wrapped by ``torch.compile``."""
    return any(getattr(m, "_compiled_call_impl", None) is not None or hasattr(m, "_orig_mod")
               for m in module.modules())
