"""Fine-tune a sequence classifier without the Trainer, in the shape of transformers'
examples/pytorch/text-classification/run_glue_no_trainer.py (written for these tests, not copied), tiny and
offline: a BERT built from a ``BertConfig`` (dropout on) and a made-up task (is token 5 in the sentence?).

What it keeps from the example: its arguments, ``set_seed``, no weight decay on biases and LayerNorm weights,
``accelerator.prepare``, ``accelerator.accumulate``, ``save_state`` into ``step_N`` / ``epoch_N`` folders, the
documented resume recipe (``load_state``, ``starting_epoch = resume_step // len(train_dataloader)``,
``skip_first_batches``), ``gather_for_metrics`` for the evaluation, and the final ``save_model`` and unwrapped
``save_pretrained``. The evaluation's predictions and a few values the example logs go to
OUTPUT_DIR/all_results.json (the example writes its metrics there).

    python run_glue_no_trainer.py --output_dir OUT --seed 7 --checkpointing_steps 1
    python run_glue_no_trainer.py --output_dir OUT2 --seed 7 --resume_from_checkpoint OUT/step_5
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
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, default_data_collator, get_scheduler

logger = get_logger(__name__)
VOCAB, LENGTH = 32, 12


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Finetune a transformers model on a text classification task")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", default="linear", choices=["linear", "cosine", "constant"])
    parser.add_argument("--num_warmup_steps", type=int, default=1)
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--checkpointing_steps", type=str, default=None,
                        help="save every n optimizer steps, or 'epoch' after each epoch")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--train_samples", type=int, default=32)
    parser.add_argument("--eval_samples", type=int, default=10)
    return parser.parse_args()


def make_dataset(samples: int, seed: int) -> list[dict]:
    """Rows as the example's tokenized dataset has them: padded ``input_ids``, ``attention_mask``, ``labels``."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(samples):
        length = int(torch.randint(LENGTH // 2, LENGTH + 1, (1,), generator=generator))
        ids = torch.randint(2, VOCAB, (length,), generator=generator).tolist()
        rows.append({"input_ids": ids + [0] * (LENGTH - length), "attention_mask": [1] * length + [0] * (LENGTH - length),
                     "labels": int(5 in ids)})
    return rows


def checkpointing(value: str | None) -> int | str | None:
    if value is not None and value.isdigit():
        return int(value)
    return value


def resume(accelerator: Accelerator, args: argparse.Namespace, train_dataloader: DataLoader,
           num_update_steps_per_epoch: int) -> tuple[int, int | None, int]:
    """The example's recipe: the folder's name says where training stopped."""
    checkpoint_path = args.resume_from_checkpoint
    path = os.path.basename(checkpoint_path)
    accelerator.print(f"Resumed from checkpoint: {checkpoint_path}")
    accelerator.load_state(checkpoint_path)
    training_difference = os.path.splitext(path)[0]
    if "epoch" in training_difference:
        starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        return starting_epoch, None, starting_epoch * num_update_steps_per_epoch
    # batches, not optimizer steps: multiply by the accumulation
    resume_step = int(training_difference.replace("step_", "")) * args.gradient_accumulation_steps
    starting_epoch = resume_step // len(train_dataloader)
    completed_steps = resume_step // args.gradient_accumulation_steps
    return starting_epoch, resume_step - starting_epoch * len(train_dataloader), completed_steps


def evaluate(accelerator: Accelerator, model, eval_dataloader: DataLoader) -> list[int]:
    model.eval()
    predictions = []
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        found, references = accelerator.gather_for_metrics((outputs.logits.argmax(dim=-1), batch["labels"]))
        predictions += [int(p) * 2 + int(r) for p, r in zip(found, references)]  # both, in one number
    return predictions


def main() -> None:
    args = parse_args()
    accelerator = (Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, log_with="all",
                               project_dir=args.output_dir) if args.with_tracking
                   else Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps))
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=LENGTH, num_labels=2)
    model = BertForSequenceClassification(config)
    train_dataloader = DataLoader(make_dataset(args.train_samples, 1), shuffle=True,
                                  collate_fn=default_data_collator, batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(make_dataset(args.eval_samples, 2), collate_fn=default_data_collator,
                                 batch_size=args.per_device_eval_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
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
    # the prepared loader's length is per process: recompute as the example does
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)
    checkpointing_steps = checkpointing(args.checkpointing_steps)

    completed_steps, starting_epoch, resume_step = 0, 0, None
    if args.resume_from_checkpoint:
        starting_epoch, resume_step, completed_steps = resume(accelerator, args, train_dataloader,
                                                              num_update_steps_per_epoch)
    predictions: list[int] = []
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
        predictions = evaluate(accelerator, model, eval_dataloader)
        accuracy = sum(p in (0, 3) for p in predictions) / len(predictions)
        logger.info(f"epoch {epoch}: accuracy {accuracy}")
        if args.checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)

    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        accelerator.save_model(model, os.path.join(args.output_dir, "final"))
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                                        save_function=accelerator.save)
        if accelerator.is_main_process:
            results = {"eval_accuracy": sum(p in (0, 3) for p in predictions) / len(predictions),
                       "predictions": predictions, "completed_steps": completed_steps,
                       "starting_epoch": starting_epoch, "resume_step": resume_step,
                       "batches_per_epoch": len(train_dataloader), "lr": lr_scheduler.get_last_lr(),
                       "num_processes": accelerator.num_processes,
                       "logged": {"accelerate_version": accelerate.__version__,
                                  "distributed_type": str(accelerator.distributed_type)}}
            with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
                json.dump(results, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
