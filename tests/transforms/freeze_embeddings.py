"""A transform added as ARCHITECTURE.md's recipe says: this one module (its test is
tests/transforms/test_add_a_transform.py). Importing it adds the step ``freeze_embeddings`` to the model path of
every strategy, right after activation checkpointing: before compile and data parallel, so DDP is built over the
parameters that still train."""

from __future__ import annotations

from torch import nn

from overdrive.transforms import ModelPath, register_step


def freeze_embeddings(path: ModelPath, model: nn.Module) -> nn.Module:
    """The model's embedding tables stop training (in place)."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.weight.requires_grad_(False)
    return model


register_step("freeze_embeddings", freeze_embeddings, after="activation_checkpointing")
