"""Training and evaluation loops of libraries written for Accelerate, on tiny models built from configs (no
downloads), for tests/compat/test_library_loops.py.

    python library_loops_run.py OUT JOB [JOB ...] [--alias]

JOBs, one after the other in this process (a Python start with these libraries costs ~10 s of CPU):

- ``diffusers``: the loop of diffusers' examples/unconditional_image_generation/train_unconditional.py on a
  tiny ``UNet2DModel``: ``DDPMScheduler`` noise, ``EMAModel``, save/load pre-hooks that call
  ``save_pretrained`` / ``from_pretrained``, gradient accumulation 2, ``save_state`` every 3 optimizer steps on
  the main process (``--save-everywhere``: on every process), then a second run resumed with ``load_state`` from the first checkpoint, skipping batches
  the example's way (``continue``), and a ``DDPMPipeline`` from the unwrapped model (EMA weights) making an
  image.
- ``st``: sentence-transformers' ``SentenceTransformerTrainer`` (tiny BERT, anchor/positive pairs,
  ``MultipleNegativesRankingLoss``), then the embedding of a fixed sentence.
- ``setfit``: setfit's ``Trainer`` (the same tiny sentence model, contrastive pairs, then the classifier head).
- ``lmeval``: lm-eval's ``HFLM`` (tiny Llama saved locally) scoring log-likelihoods; it builds its own
  ``Accelerator``. Its data-parallel mode needs ``torch.cuda.device_count() > 1``: on CPUs every process
  evaluates everything.

Rank 0 writes OUT/JOB/result.json. ``--alias`` calls overdrive.install_as_accelerate() first (without it,
``import accelerate`` is the real package, or overdrive under ``overdrive launch --as_accelerate``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

JOBS = ("diffusers", "st", "setfit", "lmeval")
WORDS = [f"t{i}" for i in range(2, 64)]  # the word-level tokenizer of hf_trainer_run.py (t0 pads, t1 ends)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("jobs", nargs="+", choices=JOBS)
    parser.add_argument("--alias", action="store_true")
    parser.add_argument("--save-everywhere", action="store_true",
                        help="diffusers: call save_state on every process (the example calls it on the main one)")
    return parser.parse_args()


def library() -> str:
    import accelerate

    return "overdrive" if accelerate.__name__ == "overdrive" or hasattr(accelerate, "install_as_accelerate") \
        else "accelerate"


def write(out: Path, job: str, result: dict) -> None:
    from accelerate.state import AcceleratorState

    state = AcceleratorState()
    if state.is_main_process:
        (out / job).mkdir(parents=True, exist_ok=True)
        result.update(library=library(), num_processes=state.num_processes)
        (out / job / "result.json").write_text(json.dumps(result, indent=1))
    state.wait_for_everyone()


# --- diffusers ------------------------------------------------------------------------------------------------

class Images:
    """16 random 3x8x8 "images" in [-1, 1] as the example's ``{"input": tensor}`` rows."""

    def __init__(self) -> None:
        import torch

        self.images = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"input": self.images[i]}


def unet():
    from diffusers import UNet2DModel

    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                       norm_num_groups=4, attention_head_dim=8)


def diffusers_run(folder: Path, resume_from: str | None, save_everywhere: bool, epochs: int = 2,
                  accumulation: int = 2, checkpointing_steps: int = 3) -> dict:
    """One run of the example's loop; ``resume_from`` names a checkpoint folder under ``folder``."""
    import math
    from datetime import timedelta

    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator, InitProcessGroupKwargs
    from accelerate.utils import ProjectConfiguration
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel

    accelerator = Accelerator(gradient_accumulation_steps=accumulation, mixed_precision="no",
                              project_config=ProjectConfiguration(project_dir=str(folder),
                                                                  logging_dir=str(folder / "logs")),
                              kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=120))])
    hooks = {"saved": [], "loaded": []}

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            ema_model.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()
                hooks["saved"].append(type(model).__name__)

    def load_model_hook(models, input_dir):
        load_model = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DModel)
        ema_model.load_state_dict(load_model.state_dict())
        ema_model.to(accelerator.device)
        for _ in range(len(models)):
            model = models.pop()
            load_model = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**load_model.config)
            model.load_state_dict(load_model.state_dict())
            hooks["loaded"].append(type(model).__name__)

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)
    torch.manual_seed(0)
    model = unet()
    ema_model = EMAModel(model.parameters(), decay=0.999, use_ema_warmup=True, inv_gamma=1.0, power=0.75,
                         model_cls=UNet2DModel, model_config=model.config)
    noise_scheduler = DDPMScheduler(num_train_timesteps=50, beta_schedule="linear", prediction_type="epsilon")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    train_dataloader = torch.utils.data.DataLoader(Images(), batch_size=2, shuffle=True)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=1 * accumulation,
                                 num_training_steps=len(train_dataloader) * epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
    ema_model.to(accelerator.device)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accumulation)
    global_step, first_epoch, resume_step = 0, 0, 0
    if resume_from is not None:
        accelerator.load_state(os.path.join(folder, resume_from))
        global_step = int(resume_from.split("-")[1])
        resume_global_step = global_step * accumulation
        first_epoch = global_step // num_update_steps_per_epoch
        resume_step = resume_global_step % (num_update_steps_per_epoch * accumulation)
    losses, skipped, checkpoints = [], 0, []
    for epoch in range(first_epoch, epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            if resume_from is not None and epoch == first_epoch and step < resume_step:
                skipped += 1
                continue
            clean_images = batch["input"]
            noise = torch.randn(clean_images.shape, device=clean_images.device)
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (clean_images.shape[0],),
                                      device=clean_images.device).long()
            noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(noisy_images, timesteps).sample.float(), noise.float())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            losses.append(accelerator.gather(loss.detach()).mean().item())
            if accelerator.sync_gradients:
                ema_model.step(model.parameters())
                global_step += 1
                if (accelerator.is_main_process or save_everywhere) and global_step % checkpointing_steps == 0:
                    save_path = os.path.join(folder, f"checkpoint-{global_step}")
                    accelerator.save_state(save_path)
                    checkpoints.append(sorted(os.listdir(save_path)))
    accelerator.wait_for_everyone()
    image = None
    if accelerator.is_main_process:
        net = accelerator.unwrap_model(model)
        ema_model.store(net.parameters())
        ema_model.copy_to(net.parameters())
        pipeline = DDPMPipeline(unet=net, scheduler=noise_scheduler)
        generator = torch.Generator(device=pipeline.device).manual_seed(0)
        images = pipeline(generator=generator, batch_size=1, num_inference_steps=5, output_type="np").images
        ema_model.restore(net.parameters())
        pipeline.save_pretrained(str(folder / "pipeline"))
        image = {"shape": list(images.shape), "mean": float(images.mean()), "std": float(images.std()),
                 "pipeline_files": sorted(os.listdir(folder / "pipeline"))}
    result = {"losses": losses, "skipped": skipped, "global_step": global_step, "checkpoints": checkpoints,
              "hooks": hooks, "image": image, "ema_decay": float(ema_model.cur_decay_value),
              "batches_per_epoch": len(train_dataloader)}
    return result  # the example's accelerator.end_training() is called once, after the last job (main())


def job_diffusers(out: Path, args: argparse.Namespace) -> dict:
    folder = out / "diffusers_run"
    first = diffusers_run(folder, None, args.save_everywhere)
    resumed = diffusers_run(folder, "checkpoint-3", args.save_everywhere)  # mid-epoch on 1 and 2 processes
    return {"first": first, "resumed": resumed}


# --- sentence-transformers and setfit ---------------------------------------------------------------------------

def sentence_model_dir(out: Path) -> str:
    """A tiny BERT + word-level tokenizer saved as a sentence-transformers model folder (rank 0 writes it)."""
    from accelerate.state import AcceleratorState

    folder = out / "tiny_bert"
    if AcceleratorState().is_main_process and not (folder / "config.json").exists():
        import torch
        from transformers import BertConfig, BertModel

        from hf_trainer_run import tokenizer

        tokenizer().save_pretrained(str(folder))
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)).save_pretrained(str(folder))
    AcceleratorState().wait_for_everyone()
    return str(folder)


def sentences(count: int, seed: int, words: list[str] = WORDS) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(6)) for _ in range(count)]


def sentence_transformer(out: Path):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    body = Transformer(sentence_model_dir(out))
    return SentenceTransformer(modules=[body, Pooling(body.get_embedding_dimension(), "mean")], device="cpu")


def job_st(out: Path, args: argparse.Namespace) -> dict:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = sentence_transformer(out)
    anchors = sentences(24, 1)
    data = Dataset.from_dict({"anchor": anchors, "positive": [" ".join(a.split()[::-1]) for a in anchors]})
    args = SentenceTransformerTrainingArguments(output_dir=str(out / "st_run"), per_device_train_batch_size=4,
                                                num_train_epochs=1, learning_rate=1e-3, logging_steps=1, seed=0,
                                                save_strategy="no", report_to=[], use_cpu=True,
                                                dataloader_drop_last=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                         loss=MultipleNegativesRankingLoss(model))
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    embedding = model.encode(["t2 t3 t4 t5"], convert_to_tensor=True)[0]
    return {"losses": losses, "embedding": embedding[:8].tolist(), "steps": trainer.state.global_step}


def job_setfit(out: Path, args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    sentence_transformer(out).save(str(out / "tiny_st"))
    torch.manual_seed(0)
    model = SetFitModel.from_pretrained(str(out / "tiny_st"))
    half = len(WORDS) // 2  # the two classes use different words
    texts = [text for pair in zip(sentences(8, 2, WORDS[:half]), sentences(8, 3, WORDS[half:])) for text in pair]
    data = Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(len(texts))]})
    args = TrainingArguments(batch_size=4, num_epochs=1, num_iterations=2, seed=0, logging_steps=1,
                             save_strategy="no", report_to=[], body_learning_rate=1e-3)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [row["embedding_loss"] for row in trainer.st_trainer.state.log_history
              if "embedding_loss" in row]
    probabilities = model.predict_proba(texts[:4])
    return {"losses": losses, "probabilities": [float(p) for p in probabilities[:, 1]]}


# --- lm-eval --------------------------------------------------------------------------------------------------

def job_lmeval(out: Path, args: argparse.Namespace) -> dict:
    import torch
    from accelerate.state import AcceleratorState
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    folder = out / "tiny_llama"
    if AcceleratorState().is_main_process and not (folder / "config.json").exists():
        from transformers import LlamaConfig, LlamaForCausalLM

        from hf_trainer_run import tokenizer

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
                         ).save_pretrained(str(folder))
        tokenizer().save_pretrained(str(folder))
    AcceleratorState().wait_for_everyone()
    lm = HFLM(pretrained=str(folder), batch_size=2, device="cpu", max_length=32)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(f"t{i} t{i + 1}", f" t{i + 2}"), idx=0)
                for i in range(1, 6)]
    scores = lm.loglikelihood(requests)
    return {"scores": [float(s[0]) for s in scores], "rank": lm.rank, "world_size": lm.world_size,
            "has_accelerator": hasattr(lm, "accelerator")}


def main() -> int:
    args = parse()
    if os.environ.get("LOOPS_STACKS_AFTER"):  # a hung run prints where each process waits
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["LOOPS_STACKS_AFTER"]), exit=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.alias:
        import overdrive

        overdrive.install_as_accelerate()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # what `accelerate launch --cpu` sets: without it Accelerate's state is one process under torchrun on CPUs
    os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    for job in args.jobs:
        write(out, job, globals()[f"job_{job}"](out, args))
    from accelerate import Accelerator

    Accelerator().end_training()  # Accelerate's ends the process group: no job could train after it
    return 0


if __name__ == "__main__":
    sys.exit(main())
