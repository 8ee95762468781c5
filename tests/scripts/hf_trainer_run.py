"""transformers ``Trainer`` runs on tiny models built from configs (no downloads), for the compat tests.

    python hf_trainer_run.py OUT JOB [JOB ...] [--alias] [--bf16] [--deepspeed STAGE]

JOB is ``bert`` (a classifier) or ``llama`` (a causal LM): train with gradient accumulation (shuffling off),
save a checkpoint half way, evaluate, predict, save the model, then resume a second Trainer from the half-way
checkpoint and train to the end; ``lora`` (BERT with a PEFT LoRA adapter: which weights changed, what was
saved); ``sft`` (TRL's SFTTrainer on Llama, 3 steps). The jobs run one after the other in this process (each
Python start with transformers costs ~8 s of CPU; several Trainers in one process is what the resumed run
does anyway). Rank 0 writes OUT/JOB/result.json for each: the losses, eval loss, the number of predicted rows,
what it saved, and which library ran it. ``--alias`` calls overdrive.install_as_accelerate() first (without
it, ``import accelerate`` is whatever the process has: the real package, or overdrive under ``overdrive
launch --as_accelerate``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

STEPS, HALF = 6, 3


JOBS = ("bert", "llama", "lora", "sft")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("jobs", nargs="+", choices=JOBS)
    parser.add_argument("--alias", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--deepspeed", type=int, default=None, help="ZeRO stage: train through DeepSpeed")
    return parser.parse_args()


def build(kind: str):
    import torch
    from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "bert":
        config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, num_labels=2,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return BertForSequenceClassification(config)
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    return LlamaForCausalLM(config)


class Rows:
    """Token rows as dicts (a torch Dataset): a label per row for BERT, labels = input_ids for Llama."""

    def __init__(self, kind: str, count: int, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 64, (count, 12), generator=generator)
        self.kind = kind

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        ids = self.ids[i]
        label = ids.clone() if self.kind == "llama" else (ids[0] > 32).long()
        return {"input_ids": ids, "attention_mask": ids.new_ones(ids.shape), "labels": label}


def tokenizer():
    """A word-level tokenizer over the 64 token ids, built in memory (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(64)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="t0", eos_token="t1", unk_token="t0")


#: set by --deepspeed: the DeepSpeed config TrainingArguments gets (Trainer's own optimizer, no C++ ops)
DEEPSPEED: dict | None = None


def arguments(out: Path, bf16: bool, **extra):
    from transformers import TrainingArguments

    if DEEPSPEED is not None:
        extra.setdefault("deepspeed", DEEPSPEED)

    return TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=2, per_device_eval_batch_size=3,
        gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=1e-2, logging_steps=1, save_steps=HALF,
        save_strategy="steps", report_to=[], seed=0, data_seed=0, use_cpu=True, bf16=bf16,
        train_sampling_strategy="sequential", dataloader_num_workers=0, disable_tqdm=True, **extra)


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main() -> None:
    global DEEPSPEED
    args = parse()
    if args.deepspeed is not None:
        # gradient_clipping explicit: DeepSpeed's own default (1.0) would differ from Trainer's
        DEEPSPEED = {"zero_optimization": {"stage": args.deepspeed}, "train_micro_batch_size_per_gpu": "auto",
                     "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
                     "zero_allow_untested_optimizer": True}
    if args.alias:
        import overdrive

        overdrive.install_as_accelerate()
    for job in args.jobs:
        run(job, Path(args.out) / job, args.bf16)


def run(job: str, out: Path, bf16: bool) -> None:
    import accelerate
    from transformers import Trainer

    kind = {"lora": "bert", "sft": "llama"}.get(job, job)
    model = build(kind)
    train, evaluation = Rows(kind, 40, 1), Rows(kind, 7, 2)  # 7 rows: uneven over 2 ranks
    result: dict = {"library": "overdrive" if accelerate.Accelerator.__module__.startswith("overdrive.") else "accelerate"}
    if job == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                                 lora_dropout=0.0))
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
    if job == "sft":
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = Dataset.from_dict({"input_ids": [row.tolist() for row in train.ids]})
        config = SFTConfig(output_dir=str(out / "sft"), per_device_train_batch_size=2, max_steps=3,
                           logging_steps=1, report_to=[], use_cpu=True, learning_rate=1e-2,
                           train_sampling_strategy="sequential", disable_tqdm=True, save_strategy="no")
        trainer = SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer())
        trainer.train()
        result["sft_losses"] = losses(trainer)
        _write(out, result, trainer)
        return
    trainer = Trainer(model=model, args=arguments(out / "run", bf16), train_dataset=train, eval_dataset=evaluation)
    trainer.train()
    result["losses"] = losses(trainer)
    result["eval_loss"] = trainer.evaluate()["eval_loss"]
    prediction = trainer.predict(evaluation)
    result["predicted_rows"] = int(prediction.predictions[0].shape[0] if isinstance(prediction.predictions, tuple)
                                   else prediction.predictions.shape[0])
    result["eval_rows"] = len(evaluation)
    result["bf16_params"] = str(next(trainer.model.parameters()).dtype)
    trainer.save_model(str(out / "saved"))
    trainer.accelerator.wait_for_everyone()
    result["saved"] = sorted(p.name for p in (out / "saved").iterdir())
    if job == "lora":
        after = dict(trainer.model.named_parameters())
        changed = sorted(k for k, v in before.items() if not bool((after[k].detach().cpu() == v.cpu()).all()))
        result["changed"] = changed
        _write(out, result, trainer)
        return
    resumed = Trainer(model=build(kind), args=arguments(out / "run", bf16), train_dataset=train,
                      eval_dataset=evaluation)
    resumed.train(resume_from_checkpoint=str(out / "run" / f"checkpoint-{HALF}"))
    result["resumed_losses"] = losses(resumed)
    _write(out, result, resumed)


def _write(out: Path, result: dict, trainer) -> None:
    if trainer.accelerator.is_main_process:
        result["num_processes"] = trainer.accelerator.num_processes
        result["mixed_precision"] = str(trainer.accelerator.mixed_precision)
        result["distributed_type"] = str(trainer.accelerator.distributed_type)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(result))
    print("RESULT", json.dumps(result), file=sys.stderr if os.environ.get("QUIET") else sys.stdout)


if __name__ == "__main__":
    main()
