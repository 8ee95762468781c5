"""One block finder (``overdrive.transforms.blocks``) for every per-block transform: tensor parallel's
matcher, activation checkpointing / compile / FSDP2 wrapping, and the pipeline split agree on the blocks of
GPT-2, Llama and BERT models built from configs, of the hand-written test model, and of a model with two
candidate lists (where the three heuristics of before disagreed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.transforms.blocks import blocks_to_wrap, find_block_list, find_blocks
from overdrive.transforms.pipeline.split import plan_stages
from overdrive.transforms.tensor_parallel import match_blocks
from tests.support.parallel import make_model

pytestmark = pytest.mark.requires("transformers")


def _hf(kind: str) -> nn.Module:
    import transformers

    small = {"vocab_size": 64, "max_position_embeddings": 64}
    configs = {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, **small)),
        "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **small)),
    }
    with torch.device("meta"):
        return configs[kind]()


class _TwoLists(nn.Module):
    """Six unnamed repeated MLPs and four blocks under ``layers``: the old tensor-parallel finder took the
    longest list, the pipeline the named one."""

    def __init__(self) -> None:
        super().__init__()
        self.adapters = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(6))
        self.layers = nn.ModuleList(make_model(layers=4).layers)


def _names(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    name_of = {id(m): n for n, m in model.named_modules()}
    return [name_of[id(m)] for m in modules]


def _three_users(model: nn.Module) -> tuple[list[str], list[str], list[str]]:
    tensor_parallel = match_blocks(model, tp_size=2).blocks
    wrapped = _names(model, blocks_to_wrap(model, FullyShardedDataParallelPlugin().transformer_cls_names_to_wrap))
    pipeline = list(plan_stages(model, 2).block_names)
    return tensor_parallel, wrapped, pipeline


@pytest.mark.parametrize("kind, path", [("gpt2", "transformer.h"), ("llama", "model.layers"),
                                        ("bert", "bert.encoder.layer")])
def test_the_three_users_agree_on_transformers_models(kind, path):
    model = _hf(kind)
    expected = [f"{path}.{i}" for i in range(3)]
    assert find_block_list(model) == path
    assert [name for name, _ in find_blocks(model)] == expected
    tensor_parallel, wrapped, pipeline = _three_users(model)
    assert tensor_parallel == wrapped == pipeline == expected


def test_the_three_users_agree_where_two_lists_compete():
    for model in (make_model(layers=4), _TwoLists()):
        expected = [f"layers.{i}" for i in range(4)]
        assert _three_users(model) == (expected, expected, expected)


def test_placeholders_and_heterogeneous_stacks():
    stage = make_model(layers=4)
    stage.layers[0] = nn.Identity()  # a pipeline stage keeps parameter-free placeholders for other stages
    assert [name for name, _ in find_blocks(stage)] == ["layers.1", "layers.2", "layers.3"]
    stack = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 2))
    assert find_blocks(stack) == [] and find_block_list(stack, repeated_only=True) is None
    assert find_block_list(stack) == ""  # the pipeline can still cut a stack of different layers
    assert find_block_list(nn.Linear(4, 4)) is None
