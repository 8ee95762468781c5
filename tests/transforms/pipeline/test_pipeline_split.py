"""Pipeline parallel in one process: finding the blocks, balancing and split points (and their errors),
stage models that keep names and classes, a stage run from received activations, the settings' checks,
the stage-to-rank layouts and the bubble share of an action list."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from overdrive import Accelerator, ParallelismConfig, PipelineConfig
from overdrive.transforms.pipeline.model import StageModule
from overdrive.transforms.pipeline.schedule import (
    bubble_fraction,
    local_stages,
    one_f_one_b_order,
    schedule_problems,
    stage_style,
    stage_to_rank,
)
from overdrive.transforms.pipeline.split import (
    RemovedModule,
    ShapeOnly,
    SkippedBlock,
    SplitError,
    balanced_bounds,
    build_stage_model,
    even_bounds,
    find_block_list,
    plan_stages,
)
from overdrive.transforms.pipeline.ties import find_tied_parameters
from tests.support.parallel import loss_fn, make_model
from tests.transforms.pipeline.pipeline_helpers import build_hf


def test_the_blocks_are_found_in_hand_written_sequential_and_transformers_models():
    assert find_block_list(make_model(layers=4)) == "layers"
    assert find_block_list(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))) == ""
    assert find_block_list(build_hf("gpt2")) == "transformer.h"
    assert find_block_list(build_hf("llama")) == "model.layers"
    assert find_block_list(nn.Linear(4, 4)) is None


def test_even_split_gives_extra_blocks_to_the_middle_stages_first():
    assert even_bounds(4, 2) == [(0, 2), (2, 4)]
    assert even_bounds(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert even_bounds(7, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]


def test_parameter_balance_counts_the_embedding_and_the_head():
    assert balanced_bounds([10, 1, 1, 1, 1, 1, 1, 10], 2) == [(0, 4), (4, 8)]
    assert balanced_bounds([1, 1, 1, 1, 1, 1], 3) == [(0, 2), (2, 4), (4, 6)]
    model = build_hf("llama", tie=False, layers=6)
    model.model.embed_tokens = nn.Embedding(2000, 32)  # a large vocabulary weighs on the first stage
    layout = plan_stages(model, 2, balance="params")
    assert layout.bounds[0][1] < 3 and layout.bounds == ((0, layout.bounds[0][1]), (layout.bounds[0][1], 6))
    assert plan_stages(model, 2, balance="layers").bounds == ((0, 3), (3, 6))


def test_split_points_name_where_stages_begin_and_bad_ones_are_explained():
    model = make_model(layers=4)
    assert plan_stages(model, 2, ["layers.3"]).bounds == ((0, 3), (3, 4))
    assert plan_stages(model, 3, ["layers.1", "layers.2"]).bounds == ((0, 1), (1, 2), (2, 4))
    with pytest.raises(SplitError) as info:
        plan_stages(model, 3, ["layers.2", "layers.7"])
    assert "layers.7" in str(info.value) and "give 2 split points" not in str(info.value)
    with pytest.raises(SplitError, match="give 1 split points"):
        plan_stages(model, 2, ["layers.1", "layers.2"])
    with pytest.raises(SplitError, match="without blocks"):
        plan_stages(model, 2, ["layers.0"])
    with pytest.raises(SplitError, match="must name items of one nn.ModuleList"):
        plan_stages(model, 2, ["head"])


def test_a_model_that_cannot_be_split_gets_an_error_saying_why_and_how():
    class Opaque(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    with pytest.raises(SplitError) as info:
        plan_stages(Opaque(), 2)
    assert "no list of repeated blocks" in str(info.value) and "split_points" in str(info.value)
    with pytest.raises(SplitError, match="at least 4 blocks.*has 2"):
        plan_stages(make_model(layers=2), 4)

    class OwnParameter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    with pytest.raises(SplitError, match="parameters of its own"):
        plan_stages(OwnParameter(), 2)


def test_a_stage_model_keeps_the_class_and_the_names_and_leaves_the_model_alone():
    model = make_model(layers=4)
    layout = plan_stages(model, 2)
    first, last = build_stage_model(model, layout, 0), build_stage_model(model, layout, 1)
    assert type(first) is type(model) and type(last) is type(model)
    names0, names1 = dict(first.named_parameters()), dict(last.named_parameters())
    assert {"embed.weight", "pos.weight", "layers.0.attn.q.weight", "layers.1.mlp.down.bias"} <= set(names0)
    assert not any(n.startswith(("layers.2", "layers.3", "head", "norm")) for n in names0)
    assert {"layers.2.attn.q.weight", "norm.weight", "head.weight"} <= set(names1)
    assert not any(n.startswith(("embed", "pos", "layers.0", "layers.1")) for n in names1)
    assert names1["head.weight"] is model.head.weight  # shared, not copied
    assert isinstance(last.layers[0], SkippedBlock) and isinstance(last.embed, ShapeOnly)
    assert isinstance(first.head, RemovedModule) and isinstance(first.layers[3], SkippedBlock)
    assert len(list(model.parameters())) == len(names0) + len(names1)  # the model is unchanged


def test_stages_run_from_received_activations_to_the_same_logits():
    model = make_model(layers=4).eval()
    layout = plan_stages(model, 2)
    ids = torch.randint(0, 64, (2, 8))
    call = {"model_loss": False}
    stages = [StageModule(build_stage_model(model, layout, s), layout, s, call) for s in range(2)]
    for stage in stages:
        stage.install_hooks()
    hidden = stages[0](overdrive_pipeline_inputs=((ids,), {}))
    (logits,) = stages[1](hidden, overdrive_pipeline_inputs=((ids,), {}))
    torch.testing.assert_close(logits, model(ids), rtol=0, atol=0)
    assert list(dict(stages[1].named_parameters())) == list(dict(stages[1].stage_model.named_parameters()))
    assert model(ids).shape == logits.shape  # the hooks do nothing outside a stage's own call


def test_tied_embeddings_are_found_and_named_on_both_stages():
    model = build_hf("gpt2", tie=True)
    layout = plan_stages(model, 2)
    (tie,) = find_tied_parameters(model, layout)
    assert set(tie.names) == {"transformer.wte.weight", "lm_head.weight"} and tie.stages == (0, 1)
    for stage in range(2):
        names = dict(build_stage_model(model, layout, stage).named_parameters(remove_duplicate=False))
        assert names["transformer.wte.weight"] is names["lm_head.weight"] is model.lm_head.weight


def test_schedule_settings_are_checked_each_naming_the_fix():
    assert schedule_problems("1f1b", 4, None, 2) == []
    assert "choose from" in schedule_problems("Bogus", 4, None, 2)[0]
    assert "one stage per rank" in schedule_problems("GPipe", 4, 2, 2)[0]
    assert "exactly 2 stages" in schedule_problems("ZBVZeroBubble", 4, 3, 2)[0]
    assert "at least as many micro-batches as stages (4)" in schedule_problems("DualPipeV", 2, 2, 2)[0]
    assert "multiple of 2" in schedule_problems("Interleaved1F1B", 5, 2, 2)[0]
    problems = PipelineConfig(schedule="GPipe", num_microbatches=0, balance="flops", loss_fn=3).problems(2)
    assert len(problems) == 3 and "balance='flops'" in problems[1] and "loss_fn=3" in problems[2]


def test_the_accelerator_reports_pipeline_and_size_problems_at_once():
    with pytest.raises(ValueError) as info:
        Accelerator(parallelism_config=ParallelismConfig(
            pp_size=2, dp_shard_size=2, pp_handler=PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=1)))
    text = str(info.value)
    assert "product is 4 but there are 1 processes" in text and "exactly 2 stages per rank" in text
    with pytest.raises(ValueError, match="scales the loss"):
        Accelerator(mixed_precision="fp16", parallelism_config=ParallelismConfig(pp_size=2, pp_handler={
            "schedule": "GPipe"}))


def test_stage_layouts_match_torch_and_the_bubble_comes_from_the_action_list():
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    for style in ("loop", "v"):
        assert stage_to_rank(2, 4, style) == generate_stage_to_rank_mapping(2, 4, style)
        assert stage_to_rank(4, 8, style) == generate_stage_to_rank_mapping(4, 8, style)
    assert local_stages(0, 2, 2, "v") == [0, 3] and local_stages(1, 2, 2, "loop") == [1, 3]
    p, m = 4, 8

    def order(name: str, per_rank: int) -> dict:  # torch's action list; stages need no process group for it
        from torch.distributed.pipelining.schedules import get_schedule_class

        stages = [SimpleNamespace(num_stages=p * per_rank, group_size=p, group_rank=0, stage_index=s, submod=None)
                  for s in local_stages(0, p, per_rank, stage_style(name))]
        return get_schedule_class(name)(stages[0] if per_rank == 1 else stages, m, loss_fn=loss_fn).pipeline_order

    gpipe, one_f_one_b = bubble_fraction(order("GPipe", 1)), bubble_fraction(one_f_one_b_order(p, m))
    assert gpipe == one_f_one_b and gpipe[0] == pytest.approx((p - 1) / (m + p - 1))
    assert bubble_fraction(order("Interleaved1F1B", 2))[0] == pytest.approx((p - 1) / (2 * m + p - 1))
    zero_bubble = [bubble_fraction(order(name, 2))[0] for name in ("InterleavedZeroBubble", "ZBVZeroBubble",
                                                                   "DualPipeV")]
    assert all(z < bubble_fraction(order("LoopedBFS", 2))[0] for z in zero_bubble)
