"""A transform added as ARCHITECTURE.md's recipe says (its test is tests/transforms/test_add_a_transform.py): an
in-place function, and a strategy that runs it by extending the steps every strategy shares. Passed as a
callable (``accelerator.strategy.extra_transforms.append(freeze_embeddings)``) or by the subclass, it runs
after activation checkpointing, before compile and data parallel, so DDP is built over the parameters that
still train."""

from __future__ import annotations

from torch import nn

from overdrive.strategies.ddp import DDPStrategy


def freeze_embeddings(model: nn.Module) -> None:
    """The model's embedding tables stop training (in place)."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            module.weight.requires_grad_(False)


class FrozenEmbeddingsDDP(DDPStrategy):
    """DDP whose model path also freezes the embeddings, before DDP wraps the model."""

    name = "ddp-frozen-embeddings"

    def apply_model_transforms(self, model: nn.Module) -> list[nn.Module]:
        blocks = super().apply_model_transforms(model)
        freeze_embeddings(model)
        return blocks
