"""Train a causal language model without the Trainer, in the shape of transformers'
examples/pytorch/language-modeling/run_clm_no_trainer.py (written for these tests, not copied), tiny and
offline: a GPT-2 built from a ``GPT2Config`` with TIED input and output embeddings (``lm_head.weight`` is
``transformer.wte.weight``), dropout off, on made-up token streams cut into blocks as the example's
``group_texts`` does.

What it keeps from the example: its arguments, ``Accelerator(gradient_accumulation_steps=...)``,
``model.tie_weights()`` after ``prepare`` on TPUs (an enum comparison), ``save_state`` into ``step_N`` / ``epoch_N`` folders, the resume
recipe with ``skip_first_batches``, the perplexity from ``gather_for_metrics(loss.repeat(batch_size))``,
and the unwrapped model's ``save_pretrained`` with ``accelerator.save``. OUTPUT_DIR/all_results.json holds
the metrics (as in the example) and a few values the example logs.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import accelerate
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, default_data_collator, get_scheduler

logger = get_logger(__name__)
VOCAB = 48


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Finetune a transformers model on a causal language modeling task")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", default="cosine", choices=["linear", "cosine", "constant"])
    parser.add_argument("--num_warmup_steps", type=int, default=1)
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--block_size", type=int, default=16)
    parser.add_argument("--checkpointing_steps", type=str, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--train_blocks", type=int, default=32)
    return parser.parse_args()


def group_texts(texts: list[list[int]], block_size: int) -> list[dict]:
    """The example's: every text concatenated, cut into blocks of ``block_size``, the remainder dropped."""
    stream = [token for text in texts for token in text]
    total = (len(stream) // block_size) * block_size
    return [{"input_ids": stream[i:i + block_size], "labels": stream[i:i + block_size]}
            for i in range(0, total, block_size)]


def make_texts(blocks: int, block_size: int, seed: int) -> list[list[int]]:
    """Sentences that follow a pattern (each token one more than the last, mod VOCAB) from random starts."""
    generator = torch.Generator().manual_seed(seed)
    texts, length = [], 0
    while length < blocks * block_size:
        start, size = torch.randint(0, VOCAB, (2,), generator=generator).tolist()
        texts.append([(start + i) % VOCAB for i in range(4 + size % 9)])
        length += len(texts[-1])
    return texts


def resume(accelerator: Accelerator, args: argparse.Namespace, train_dataloader: DataLoader,
           num_update_steps_per_epoch: int) -> tuple[int, int | None, int]:
    checkpoint_path = args.resume_from_checkpoint
    path = os.path.basename(checkpoint_path)
    accelerator.print(f"Resumed from checkpoint: {checkpoint_path}")
    accelerator.load_state(checkpoint_path)
    training_difference = os.path.splitext(path)[0]
    if "epoch" in training_difference:
        starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        return starting_epoch, None, starting_epoch * num_update_steps_per_epoch
    resume_step = int(training_difference.replace("step_", "")) * args.gradient_accumulation_steps
    starting_epoch = resume_step // len(train_dataloader)
    completed_steps = resume_step // args.gradient_accumulation_steps
    return starting_epoch, resume_step - starting_epoch * len(train_dataloader), completed_steps


def evaluate(accelerator: Accelerator, model, eval_dataloader: DataLoader, batch_size: int) -> tuple[float, int]:
    model.eval()
    losses = []
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(batch_size)))
    all_losses = torch.cat(losses)
    eval_loss = torch.mean(all_losses)
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    return perplexity, len(all_losses)


def main() -> None:
    args = parse_args()
    accelerator_log_kwargs = {"log_with": "all", "project_dir": args.output_dir} if args.with_tracking else {}
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, **accelerator_log_kwargs)
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    config = GPT2Config(vocab_size=VOCAB, n_positions=args.block_size, n_embd=16, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    train_dataset = group_texts(make_texts(args.train_blocks, args.block_size, 1), args.block_size)
    eval_dataset = group_texts(make_texts(10, args.block_size, 2), args.block_size)[:10]
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=default_data_collator,
                                 batch_size=args.per_device_eval_batch_size)
    no_decay = ["bias", "layer_norm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=args.max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)
    if accelerator.distributed_type == DistributedType.XLA:
        model.tie_weights()  # as the example: on TPUs preparing loses the tie
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)
    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)

    completed_steps, starting_epoch, resume_step = 0, 0, None
    if args.resume_from_checkpoint:
        starting_epoch, resume_step, completed_steps = resume(accelerator, args, train_dataloader,
                                                              num_update_steps_per_epoch)
    perplexity, evaluated = float("nan"), 0
    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
            if isinstance(checkpointing_steps, int) and completed_steps % checkpointing_steps == 0 \
                    and accelerator.sync_gradients:
                output_dir = f"step_{completed_steps}"
                if args.output_dir is not None:
                    output_dir = os.path.join(args.output_dir, output_dir)
                accelerator.save_state(output_dir)
            if completed_steps >= args.max_train_steps:
                break
        perplexity, evaluated = evaluate(accelerator, model, eval_dataloader, args.per_device_eval_batch_size)
        logger.info(f"epoch {epoch}: perplexity: {perplexity}")
        if args.checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)

    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                                        save_function=accelerator.save)
        if accelerator.is_main_process:
            results = {"perplexity": perplexity, "evaluated": evaluated, "completed_steps": completed_steps,
                       "starting_epoch": starting_epoch, "resume_step": resume_step,
                       "batches_per_epoch": len(train_dataloader), "lr": lr_scheduler.get_last_lr(),
                       "tied": unwrapped_model.lm_head.weight is unwrapped_model.transformer.wte.weight,
                       "num_processes": accelerator.num_processes,
                       "logged": {"accelerate_version": accelerate.__version__,
                                  "distributed_type": str(accelerator.distributed_type)}}
            with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
                json.dump(results, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
