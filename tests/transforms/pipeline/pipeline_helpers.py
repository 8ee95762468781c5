"""Shared pieces of the pipeline tests: transformers models built from configs, the one-process reference
loop, and the same loop through a pipelined Accelerator (the target passed as ``labels=``).

Holds no tests itself; the functions are importable by spawned ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.support.parallel import accelerated_losses, loss_fn, make_data, make_model

LAYERS = 4  # enough blocks for 2 ranks x 2 stages


def build_hf(kind: str, tie: bool = True, layers: int = LAYERS) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie))
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=layers, n_head=4, n_positions=64,
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                            eos_token_id=0, tie_word_embeddings=tie))


def reference(global_batch: int, steps: int, model: nn.Module | None = None, hf: bool = False,
              clip: float | None = 1.0, accumulate: int = 1) -> list[float]:
    """One process, plain PyTorch: the loss of each optimizer step (the mean over an accumulation window)."""
    model = model if model is not None else make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, window = [], []
    for ids, labels in DataLoader(make_data(), batch_size=global_batch // accumulate):
        loss = model(input_ids=ids, labels=ids).loss if hf else loss_fn(model(ids), labels)
        (loss / accumulate).backward()
        window.append(loss.item())
        if len(window) < accumulate:
            continue
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(sum(window) / len(window))
        window = []
        if len(losses) == steps:
            break
    return losses


def pipelined(accelerator: Any, batch_size: int, steps: int, model: nn.Module | None = None, hf: bool = False,
              clip: float | None = 1.0) -> dict[str, Any]:
    """The same loop through ``accelerator`` (``batch_size`` per data-parallel rank): global loss of each
    optimizer step (``gather`` counts each pipeline once) and the clip norms."""

    def forward_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (model(input_ids=ids, labels=ids) if hf else model(ids, labels=labels)).loss

    result = accelerated_losses(accelerator, batch_size, steps, clip=clip,
                                model=model if model is not None else make_model(layers=LAYERS),
                                compute_loss=forward_loss)
    model = result["model"]
    model.eval()  # forward only, on the first batch
    with torch.no_grad():
        ids, labels = next(iter(DataLoader(make_data(), batch_size=batch_size)))
        loss = forward_loss(model, ids, labels)
    model.train()
    eval_loss = accelerator.gather(loss).mean().item()
    return {**result, "eval_loss": eval_loss}


def reference_eval_loss(model: nn.Module, global_batch: int, hf: bool = False) -> float:
    """The loss of ``model`` (trained by ``reference``) on the first batch, forward only."""
    model.eval()
    with torch.no_grad():
        ids, labels = next(iter(DataLoader(make_data(), batch_size=global_batch)))
        return (model(input_ids=ids, labels=ids).loss if hf else loss_fn(model(ids), labels)).item()


def shortened(step: int, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every other batch has shorter sequences: a new input shape (a new schedule) inside an accumulation
    window."""
    return (ids[:, :5], labels[:, :5]) if step % 2 else (ids, labels)


def mixed_shape_reference(steps: int) -> list[float]:
    """One process: each optimizer step accumulates a batch of 8 full and a batch of 8 short sequences."""
    model = make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, window = [], []
    for step, (ids, labels) in enumerate(DataLoader(make_data(), batch_size=8)):
        ids, labels = shortened(step, ids, labels)
        loss = loss_fn(model(ids), labels)
        (loss / 2).backward()
        window.append(loss.item())
        if step % 2:
            opt.step()
            opt.zero_grad()
            losses.append(sum(window) / 2)
            window = []
        if len(losses) == steps:
            break
    return losses


def mixed_shape_pipelined(accelerator: Any, batch_size: int, steps: int) -> list[float]:
    """The same through ``accelerator`` (``gradient_accumulation_steps=2``)."""
    model = make_model(layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(make_data(), batch_size=batch_size))
    losses, window = [], []
    for step, (ids, labels) in enumerate(loader):
        ids, labels = shortened(step, ids, labels)
        with accelerator.accumulate(model):
            loss = model(ids, labels=labels).loss
            accelerator.backward(loss)
            window.append(accelerator.gather(loss.detach()).mean().item())
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            losses.append(sum(window) / 2)
            window = []
        if len(losses) == steps:
            break
    return losses


def pipeline_accelerator(schedule: str = "1F1B", stages_per_rank: int | None = None, num_microbatches: int = 4,
                         with_loss_fn: bool = True, accumulate: int = 1, dataloader_config: Any = None,
                         **sizes: Any) -> Any:
    from overdrive import Accelerator, ParallelismConfig, PipelineConfig

    config = PipelineConfig(schedule=schedule, stages_per_rank=stages_per_rank, num_microbatches=num_microbatches,
                            loss_fn=loss_fn if with_loss_fn else None)
    return Accelerator(gradient_accumulation_steps=accumulate, dataloader_config=dataloader_config,
                       parallelism_config=ParallelismConfig(pp_size=2, pp_handler=config, **sizes))
