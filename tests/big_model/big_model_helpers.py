"""Small models and checkpoints shared by the big-model tests (built from code, no downloads)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A residual block: the kind of module ``no_split_module_classes`` names."""

    def __init__(self, width: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Toy(nn.Module):
    """Embedding, 4 blocks, a head tied to the embedding (sizes in bytes: embed 800, block 880)."""

    def __init__(self, tie: bool = True, width: int = 10, vocab: int = 20) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(4))
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("scale", torch.ones(width))
        self.register_buffer("cache", torch.zeros(1), persistent=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def llama_config(layers: int = 4, tie: bool = True, hidden: int = 64, vocab: int = 1000):  # noqa: ANN201
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=tie, max_position_embeddings=128)


def llama(layers: int = 4, tie: bool = True, seed: int = 0):  # noqa: ANN201
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(layers, tie)).eval()
