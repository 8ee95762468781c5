"""The model path's shared steps, each an ``apply_*`` function with explicit arguments.

Every strategy's ``wrap_model`` (``strategies/``) calls them in one fixed order, the order of this module:

===============================  ======================================================================
step                             what it does
===============================  ======================================================================
:func:`apply_placement`          the model on the device; a model on the meta device is refused
                                 (:func:`refuse_meta`, the one refusal)
:func:`apply_precision_hooks`    autocast around forward; returns the hook handles to record
``apply_fp8``                    fp8 conversion of the linear layers (``precision/fp8.py``)
``apply_tensor_parallel``        tensor parallel over the mesh's ``tp`` axis (``transforms/tensor_parallel.py``;
                                 context parallel changes no module)
:func:`model_blocks`             the blocks the next steps work on (``transforms/blocks.py``)
``apply_activation_checkpointing``  checkpointing of the blocks (``transforms/activation_checkpointing.py``)
``apply_compile``                ``torch.compile`` in place, whole or per block (``transforms/compile.py``)
data parallel                    ``apply_ddp`` (``transforms/data_parallel.py``) or ``apply_fully_shard``
                                 (``transforms/fully_shard.py``)
===============================  ======================================================================

The steps every strategy shares after placement and precision (tensor parallel to compile) are one method,
``StrategyBase.apply_model_transforms``; a transform of one's own joins there by subclassing a strategy or by
a callable in ``StrategyBase.extra_transforms``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn

from overdrive.transforms.settings import ModelTransforms

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from overdrive.precision.amp import AmpPrecision

#: parameters fp8 conversion replaced: ``id(old) -> (weakref(old), new)``
Replaced = dict[int, tuple[weakref.ref, nn.Parameter]]


def refuse_meta(model: nn.Module, remedy: str = "") -> None:
    """Fail if ``model`` has parameters on the meta device: there are no weights to train."""
    on_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if on_meta:
        shown = ", ".join(on_meta[:5]) + (", ..." if len(on_meta) > 5 else "")
        raise ValueError(
            f"prepare() got a model with {len(on_meta)} parameters on the meta device ({shown}); materialise it "
            f"first (model.to_empty(device=...) then load its weights){remedy}")


def apply_placement(model: nn.Module, device: torch.device, meta_remedy: str = "") -> nn.Module:
    """``model`` on ``device``; a model on the meta device is refused first, ``meta_remedy`` ending the error."""
    refuse_meta(model, meta_remedy)
    return model.to(device)


def apply_precision_hooks(model: nn.Module, precision: AmpPrecision) -> list[RemovableHandle]:
    """Autocast around ``model``'s forward (floating outputs back in fp32); the handles that remove it (none
    without mixed precision), for the caller to record with the prepared model."""
    return precision.attach(model)


def model_blocks(model: nn.Module, transforms: ModelTransforms) -> list[nn.Module]:
    """The blocks activation checkpointing, regional compile and ``fully_shard``'s wrap policy work on, found
    after tensor parallel: the classes of ``block_names``, else FSDP's wrap names, else the repeated blocks."""
    # lazy: a run whose steps use no blocks never loads the block finder
    from overdrive.transforms.blocks import blocks_to_wrap

    wrap_names = transforms.fsdp.transformer_cls_names_to_wrap if transforms.fsdp is not None else None
    return blocks_to_wrap(model, list(transforms.block_names) or wrap_names)
