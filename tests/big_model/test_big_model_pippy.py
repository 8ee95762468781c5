"""prepare_pippy: a model split over 2 gloo processes gives the outputs of the whole model in one."""

from __future__ import annotations

import importlib.util

import torch

from tests.big_model.big_model_helpers import Toy
from tests.support.distributed import run_distributed


def _split_run() -> dict:
    from overdrive.inference import prepare_pippy

    torch.manual_seed(0)
    model = Toy(tie=True, width=16, vocab=32)  # the head (last stage) is tied to the embedding (first stage)
    x = torch.randint(0, 32, (5, 7), generator=torch.Generator().manual_seed(3))  # 5: padded to 2 chunks
    with torch.no_grad():
        expected = model(x)
    split = prepare_pippy(model, split_points=["blocks.2"], gather_output=True)
    gathered = split(x)
    last_only = prepare_pippy(Toy(tie=True, width=16, vocab=32).eval(), num_chunks=1)
    result = {"expected": expected, "gathered": gathered, "split": split.hf_split_points,
              "last_only": None if last_only(x) is None else "tensor"}
    if importlib.util.find_spec("transformers") is None:
        return result
    from tests.big_model.big_model_helpers import llama

    model = llama(layers=4)  # a transformers model: its output keeps .logits
    ids = torch.randint(0, 1000, (4, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        result["llama_expected"] = model(ids).logits
    result["llama"] = prepare_pippy(model, gather_output=True)(ids).logits
    return result


def test_prepare_pippy_matches_one_process() -> None:
    results = run_distributed(_split_run, 2, timeout=180)
    for rank, result in enumerate(results):
        assert result["split"] == ["blocks.2"]
        assert torch.allclose(result["gathered"], result["expected"], atol=1e-6), rank
    assert [r["last_only"] for r in results] == [None, "tensor"]
    for result in results:
        if "llama" in result:
            assert torch.allclose(result["llama"], result["llama_expected"], atol=1e-6)


def test_prepare_pippy_with_one_process_runs_the_whole_model() -> None:
    from overdrive.inference import prepare_pippy
    from overdrive.training.state import PartialState

    model = Toy(tie=False)
    x = torch.randint(0, 20, (3, 4))
    with torch.no_grad():
        expected = model(x)
    try:
        split = prepare_pippy(model)
        assert split.hf_split_points == [] and torch.equal(split(x), expected)
    finally:
        PartialState._reset_state()
