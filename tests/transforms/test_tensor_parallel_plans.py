"""The tensor-parallel plan matcher, by structure: a hand-written block and GPT-2-, Llama- and BERT-shaped
models built from transformers configs (no downloads), user plans and the errors for what does not fit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from overdrive.transforms.tensor_parallel import match_blocks, plan_from_patterns
from tests.support.parallel import make_model


def _layer0(plan, prefix: str) -> dict[str, str]:
    return {k[len(prefix):]: v for k, v in plan.styles.items() if k.startswith(prefix)}


def test_hand_written_block_attention_and_gated_mlp():
    plan = match_blocks(make_model(), tp_size=2, sequence_parallel=True)
    assert _layer0(plan, "layers.0.") == {
        "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
        "mlp.gate": "colwise", "mlp.up": "colwise", "mlp.down": "rowwise",
        "norm1": "sequence_parallel", "norm2": "sequence_parallel"}
    assert plan.attention == ["layers.0.attn", "layers.1.attn"] and plan.blocks == ["layers.0", "layers.1"]
    assert "head" not in plan.styles and "embed" not in plan.styles  # outside the blocks: replicated


def test_heads_that_do_not_divide_are_named():
    with pytest.raises(ValueError, match=r"layers.0.attn.q has 4 heads of size 8, which do not divide by tp_size=3"):
        match_blocks(make_model(), tp_size=3)


def test_a_model_without_blocks_of_that_shape_gets_an_error_naming_its_modules():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"no tensor-parallel plan fits Sequential.*Unmatched modules: 0, 2"):
        match_blocks(model, tp_size=2)


def test_user_plan_patterns_styles_and_errors():
    plan = plan_from_patterns(make_model(), {"layers.*.mlp.up": "colwise", "layers.*.mlp.gate": "colwise",
                                             "layers.*.mlp.down": "rowwise"})
    assert sorted(plan.styles) == [f"layers.{i}.mlp.{n}" for i in range(2) for n in ("down", "gate", "up")]
    with pytest.raises(ValueError) as info:
        plan_from_patterns(make_model(), {"layers.*.norm1": "colwise", "nothing.*": "rowwise", "head": "sideways"})
    text = str(info.value)
    assert "layers.0.norm1 is a LayerNorm" in text and "['nothing.*'] match no module" in text
    assert "= 'sideways' is not valid; choose from " in text



def _llama() -> nn.Module:
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def _gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config)


def _bert() -> nn.Module:
    import transformers

    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=64)
    with torch.device("meta"):
        return transformers.BertForMaskedLM(config)


@pytest.mark.requires("transformers")
def test_llama_is_recognised_by_structure():
    plan = match_blocks(_llama(), tp_size=2, sequence_parallel=True)
    assert _layer0(plan, "model.layers.0.") == {
        "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
        "mlp.down_proj": "rowwise", "input_layernorm": "sequence_parallel",
        "post_attention_layernorm": "sequence_parallel"}
    assert plan.attention[0] == "model.layers.0.self_attn"
    with pytest.raises(ValueError, match="k_proj has 2 heads of size 8, which do not divide by tp_size=4"):
        match_blocks(_llama(), tp_size=4)  # 2 key/value heads cannot be split 4 ways


@pytest.mark.requires("transformers")
def test_bert_attention_output_and_split_mlp_are_paired_across_submodules():
    plan = match_blocks(_bert(), tp_size=2, sequence_parallel=True)
    assert _layer0(plan, "bert.encoder.layer.0.") == {
        "attention.self.query": "colwise", "attention.self.key": "colwise", "attention.self.value": "colwise",
        "attention.output.dense": "rowwise", "intermediate.dense": "colwise", "output.dense": "rowwise",
        "attention.output.LayerNorm": "sequence_parallel", "output.LayerNorm": "sequence_parallel",
        "attention.output.dropout": "sequence_parallel", "output.dropout": "sequence_parallel"}
    assert plan.attention[0] == "bert.encoder.layer.0.attention.self"


@pytest.mark.requires("transformers")
def test_gpt2_fused_qkv_stays_replicated_with_a_notice_and_cannot_be_forced():
    plan = match_blocks(_gpt2(), tp_size=2)
    assert _layer0(plan, "transformer.h.0.") == {
        "attn.c_attn": "replicate", "attn.c_proj": "replicate", "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}
    assert any("fused attention projections such as transformer.h.0.attn.c_attn" in n for n in plan.notes)
    with pytest.raises(ValueError, match="transformer.h.0.attn.c_attn is a fused projection"):
        plan_from_patterns(_gpt2(), {"transformer.h.*.attn.c_attn": "colwise"})
    with pytest.raises(ValueError, match="sequence_parallel: block transformer.h.0 has a fused projection"):
        match_blocks(_gpt2(), tp_size=2, sequence_parallel=True)
