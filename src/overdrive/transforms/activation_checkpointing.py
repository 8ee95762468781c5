"""Activation checkpointing: recompute each block's activations in backward instead of keeping them."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from overdrive.runtime.torch_private import checkpoint_module


def apply_activation_checkpointing(blocks: Iterable[nn.Module], model: nn.Module | None = None) -> int:
    """Checkpoint every module of ``blocks`` in place and return how many; given the ``model`` they come from,
    no blocks at all is an error that names the remedy.

    Uses the composable ``checkpoint`` (non-reentrant): modules keep their names, so state-dict keys,
    optimizer mappings and checkpoints are the same with and without it.
    """
    blocks = list(blocks)
    if not blocks and model is not None:
        raise ValueError(f"activation_checkpointing found no blocks in {type(model).__name__}; name their "
                         "classes (ActivationCheckpointingKwargs(block_names=[...]) or "
                         "transformer_cls_names_to_wrap)")
    for block in blocks:
        checkpoint_module(block)
    return len(blocks)
