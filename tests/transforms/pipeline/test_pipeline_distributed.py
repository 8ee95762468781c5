"""Pipeline parallel on 2 and 4 gloo ranks against one process on the same global batch: every schedule,
accumulation, evaluation and ``gather_for_metrics``, transformers models split automatically (tied
embeddings included), composition with FSDP2, DDP and tensor parallel, and checkpoints that resume
exactly and load at pp=1."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.parallel import loss_fn, make_data, make_model, worst
from tests.transforms.pipeline.pipeline_helpers import (
    LAYERS,
    build_hf,
    mixed_shape_pipelined,
    mixed_shape_reference,
    pipeline_accelerator,
    pipelined,
    reference,
    reference_eval_loss,
)

pytestmark = pytest.mark.slow

STEPS = 20
TOLERANCE = 1e-5  # fp32; measured <= 1e-6
SCHEDULES = [("GPipe", None), ("1F1B", None), ("Interleaved1F1B", 2), ("LoopedBFS", 2),
             ("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2)]


def _schedules_and_loop_features() -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from overdrive import Accelerator, ParallelismConfig, PipelineConfig

    found: dict[str, Any] = {}
    for name, spr in SCHEDULES:
        run = pipelined(pipeline_accelerator(name, spr), batch_size=8, steps=STEPS)
        found[name] = run["losses"], run["norms"], run["eval_loss"]
    # training, evaluation in the middle, training again (each switch re-initialises torch's stages)
    found["switching"] = _train_with_evaluation(pipeline_accelerator("ZBVZeroBubble", 2))
    # accumulation: 2 windows of 4 samples make one step of 8
    config = PipelineConfig(schedule="1F1B", num_microbatches=2, loss_fn=loss_fn)
    accelerator = Accelerator(gradient_accumulation_steps=2,
                              parallelism_config=ParallelismConfig(pp_size=2, pp_handler=config))
    run = pipelined(accelerator, batch_size=4, steps=STEPS)
    found["accumulation"] = run["losses"]
    # evaluation: forward only, every sample gathered once, the mean loss on every rank
    model = run["model"]
    model.eval()
    loader = accelerator.prepare(DataLoader(make_data(n=60), batch_size=6))
    predictions, losses = [], []
    with torch.no_grad():
        for ids, labels in loader:
            outputs = model(ids, labels=labels)
            losses.append(outputs.loss.item())
            predictions.append(accelerator.gather_for_metrics((outputs.logits.argmax(-1), labels)))
            plain = model(ids)  # no labels: logits only
            assert plain.loss is None and plain.logits.shape[1:] == outputs.logits.shape[1:]
    found["eval"] = losses, sum(len(p[0]) for p in predictions), sum(len(p[1]) for p in predictions)
    model.train()
    try:  # a batch that does not split into the micro-batches: refused before any communication
        model(torch.zeros(3, 8, dtype=torch.long), labels=torch.zeros(3, 8, dtype=torch.long))
    except ValueError as error:
        found["odd_batch"] = str(error)
    return found


def _train_with_evaluation(accelerator: Any) -> list[float]:
    from torch.utils.data import DataLoader

    model = make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(make_data(), batch_size=8))
    losses = []
    for step, (ids, labels) in enumerate(loader):
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                model(ids, labels=labels)
            model.train()
        loss = model(ids, labels=labels).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if len(losses) == STEPS:
            break
    return losses


@pytest.mark.timeout(400)
def test_every_schedule_follows_one_process_and_the_loop_features_work():
    results = run_distributed(_schedules_and_loop_features, 2, timeout=380)
    trained = make_model(layers=LAYERS)
    expected = reference(8, STEPS, model=trained)
    expected_eval, expected_norms = reference_eval_loss(trained, 8), _reference_norms()
    for name, _ in SCHEDULES:
        for rank, found in enumerate(results):
            losses, norms, eval_loss = found[name]
            assert worst(losses, expected) < TOLERANCE, (name, rank, losses[:3], expected[:3])
            assert worst(norms, expected_norms) < TOLERANCE, (name, rank)  # global norm over the stages
            assert abs(eval_loss - expected_eval) < TOLERANCE, (name, rank)
    for found in results:
        assert worst(found["accumulation"], expected) < TOLERANCE
        assert worst(found["switching"], expected) < TOLERANCE
        losses, predictions, labels = found["eval"]
        assert predictions == labels == 60  # each sample once: only the rank with the last stage contributes
        assert losses == results[0]["eval"][0]  # the same loss on every rank
        assert "num_microbatches=2" in found["odd_batch"] and "multiple of 2" in found["odd_batch"]


def _reference_norms() -> list[float]:
    from torch.utils.data import DataLoader

    model = make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    norms = []
    for ids, labels in DataLoader(make_data(), batch_size=8):
        loss_fn(model(ids), labels).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
        if len(norms) == STEPS:
            break
    return norms


def _transformers_models() -> dict[str, Any]:
    found = {}
    for kind, tie in (("gpt2", True), ("llama", False)):
        accelerator = pipeline_accelerator(num_microbatches=2, with_loss_fn=False)  # the model's own loss
        run = pipelined(accelerator, batch_size=8, steps=STEPS, model=build_hf(kind, tie), hf=True)
        names = [n for n, _ in run["model"].named_parameters(remove_duplicate=False)]
        found[kind] = run["losses"], names, run["eval_loss"]
    return found


@pytest.mark.timeout(400)
def test_transformers_gpt2_and_llama_split_automatically():
    results = run_distributed(_transformers_models, 2, timeout=380)
    for kind, tie in (("gpt2", True), ("llama", False)):
        trained = build_hf(kind, tie)
        expected = reference(8, STEPS, model=trained, hf=True)
        expected_eval = reference_eval_loss(trained, 8, hf=True)
        for found in results:
            assert worst(found[kind][0], expected) < TOLERANCE, (kind, found[kind][0][:3], expected[:3])
            assert abs(found[kind][2] - expected_eval) < TOLERANCE, kind
        first, last = results[0][kind][1], results[1][kind][1]
        if kind == "gpt2":
            # blocks 0-1 and the embedding on stage 0, blocks 2-3 and the head on stage 1; the tied
            # matrix is named as the whole model names it on both
            assert "transformer.h.1.attn.c_attn.weight" in first and "transformer.h.2.attn.c_attn.weight" in last
            assert {"transformer.wte.weight", "lm_head.weight"} <= set(first) & set(last)
            assert "transformer.ln_f.weight" in last and "transformer.ln_f.weight" not in first
        else:
            assert "model.embed_tokens.weight" in first and "lm_head.weight" in last
            assert "lm_head.weight" not in first and "model.embed_tokens.weight" not in last


def _compositions() -> dict[str, list[float]]:
    found = {}
    for kind, sizes, batch in (("fsdp2", {"dp_shard_size": 2}, 4), ("ddp", {"dp_replicate_size": 2}, 4),
                               ("tp", {"tp_size": 2}, 8)):
        accelerator = pipeline_accelerator("1F1B", num_microbatches=2, **sizes)
        run = pipelined(accelerator, batch_size=batch, steps=STEPS)
        found[kind], found[kind + "_eval"] = run["losses"], run["eval_loss"]
        found[kind + "_type"] = accelerator.distributed_type.value
    # a new input shape inside an accumulation window: torch's first step of the new schedule clears FSDP
    # gradients, which the pipelined model keeps
    accelerator = pipeline_accelerator("1F1B", num_microbatches=2, accumulate=2, dp_shard_size=2)
    found["mixed_shapes"] = mixed_shape_pipelined(accelerator, batch_size=4, steps=5)
    return found


@pytest.mark.timeout(400)
def test_pipeline_composes_with_fsdp2_ddp_and_tensor_parallel_on_4_ranks():
    results = run_distributed(_compositions, 4, timeout=380)
    trained = make_model(layers=LAYERS)
    expected, mixed = reference(8, STEPS, model=trained), mixed_shape_reference(5)
    for rank, found in enumerate(results):
        for kind, batch in (("fsdp2", 4), ("ddp", 4), ("tp", 8)):
            assert worst(found[kind], expected) < TOLERANCE, (kind, rank)
            assert abs(found[kind + "_eval"] - reference_eval_loss(trained, batch)) < TOLERANCE, (kind, rank)
        assert found["fsdp2_type"] == "FSDP"
        assert worst(found["mixed_shapes"], mixed) < TOLERANCE, rank


def _train(accelerator: Any, model: Any, opt: Any, loader: Any, steps: int) -> list[float]:
    losses = []
    for ids, _ in loader:
        loss = model(input_ids=ids, labels=ids).loss  # the same line with and without a pipeline
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if len(losses) == steps:
            break
    return losses


def _prepared(pp: bool) -> tuple[Any, ...]:
    from torch.utils.data import DataLoader

    from overdrive import Accelerator, DataLoaderConfiguration

    exact = DataLoaderConfiguration(exact_resume=True)  # load_state continues the loader mid-epoch
    accelerator = (pipeline_accelerator(num_microbatches=2, with_loss_fn=False, dataloader_config=exact) if pp
                   else Accelerator(dataloader_config=exact))
    model = build_hf("gpt2", tie=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_data(), batch_size=8, shuffle=True)
    return (accelerator, *accelerator.prepare(model, opt, loader))


def _save_and_resume(folder: str) -> dict[str, Any]:
    accelerator, model, opt, loader = _prepared(True)
    it = iter(loader)
    before = _train(accelerator, model, opt, it, 5)
    accelerator.save_state(folder)
    accelerator.save_model(model, folder + "_weights")
    after = _train(accelerator, model, opt, it, 5)
    accelerator, model, opt, loader = _prepared(True)
    accelerator.load_state(folder)
    resumed = _train(accelerator, model, opt, loader, 5)
    return {"before": before, "after": after, "resumed": resumed}


@pytest.mark.timeout(400)
def test_checkpoint_of_a_pipeline_resumes_exactly_and_loads_at_pp1(tmp_path: Path):
    folder = str(tmp_path / "ckpt")
    results = run_distributed(_save_and_resume, 2, folder, timeout=380)
    for found in results:
        assert found["resumed"] == found["after"]  # exact: same layout, same numbers
    accelerator, model, opt, loader = _prepared(False)  # one process, no pipeline
    accelerator.load_state(folder)
    resumed = _train(accelerator, model, opt, loader, 5)
    assert worst(resumed, results[0]["after"]) < TOLERANCE
    # save_model wrote the whole model once: every weight, equal to the checkpoint's
    from safetensors.torch import load_file

    weights = load_file(str(Path(folder + "_weights") / "model.safetensors"))
    fresh = build_hf("gpt2", tie=True)
    missing, unexpected = fresh.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: stored once
    accelerator2, model2, _, _ = _prepared(False)
    accelerator2.load_state(folder)
    assert all(torch.equal(weights[k], v) for k, v in model2.state_dict().items() if k in weights)
    assert not math.isnan(resumed[0])
