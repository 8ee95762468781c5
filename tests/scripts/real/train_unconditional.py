"""Train a denoiser on images, in the shape of diffusers' examples/unconditional_image_generation/
train_unconditional.py (written for these tests, not copied), without diffusers: a small conv net with
``save_pretrained`` / ``from_pretrained``, an EMA of its weights as diffusers' ``EMAModel`` keeps it, DDPM
noise, 16 made-up 3x8x8 images.

What it keeps from the example: its arguments, the save/load pre-hooks (the model and the EMA into ``unet`` /
``unet_ema`` folders, ``weights.pop()``, ``models.pop()``) registered only ``if
version.parse(accelerate.__version__) >= version.parse("0.16.0")``, ``save_state`` on the main process only
into ``checkpoint-N`` folders (``--checkpoints_total_limit``), ``--resume_from_checkpoint`` (a name under
``--output_dir`` or ``latest``) with the example's arithmetic and its batch skipping (``continue``), gradient
clipping when the gradients sync, the EMA stepped after each optimizer step, and the final EMA weights
copied into the model to save it. OUTPUT_DIR gets ``model.safetensors`` (the trained weights),
``ema.safetensors`` (the EMA's) and ``all_results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil

import accelerate
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import ProjectConfiguration, set_seed
from packaging import version
from safetensors.torch import load_file, save_file

logger = get_logger(__name__, log_level="INFO")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    parser.add_argument("--output_dir", type=str, default="ddpm-model")
    parser.add_argument("--resolution", type=int, default=8)
    parser.add_argument("--train_batch_size", type=int, default=2)
    parser.add_argument("--num_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--lr_warmup_steps", type=int, default=1)
    parser.add_argument("--use_ema", action="store_true")
    parser.add_argument("--ema_inv_gamma", type=float, default=1.0)
    parser.add_argument("--ema_power", type=float, default=3 / 4)
    parser.add_argument("--ema_max_decay", type=float, default=0.9999)
    parser.add_argument("--ddpm_num_steps", type=int, default=50)
    parser.add_argument("--checkpointing_steps", type=int, default=3)
    parser.add_argument("--checkpoints_total_limit", type=int, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--seed", type=int, default=None)
    return parser.parse_args()


class Denoiser(torch.nn.Module):
    """Predicts the noise in an image at a timestep; saved as a folder like a diffusers model."""

    def __init__(self, channels: int = 8, num_train_timesteps: int = 50) -> None:
        super().__init__()
        self.config = {"channels": channels, "num_train_timesteps": num_train_timesteps}
        self.time_embedding = torch.nn.Embedding(num_train_timesteps, channels)
        self.conv_in = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, channels)
        self.conv_mid = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.conv_out = torch.nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, sample: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        hidden = self.conv_in(sample) + self.time_embedding(timesteps)[:, :, None, None]
        hidden = self.conv_mid(F.silu(self.norm(hidden)))
        return self.conv_out(F.silu(hidden))

    def register_to_config(self, **config) -> None:
        self.config.update(config)

    def save_pretrained(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()},
                  os.path.join(folder, "diffusion_pytorch_model.safetensors"))

    @classmethod
    def from_pretrained(cls, folder: str, subfolder: str = "") -> Denoiser:
        folder = os.path.join(folder, subfolder)
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        # like diffusers' from_config: keys that are not the constructor's (the EMA's counters) stay in config
        model = cls(channels=config["channels"], num_train_timesteps=config["num_train_timesteps"])
        model.register_to_config(**config)
        model.load_state_dict(load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors")))
        return model


class EMAModel:
    """An exponential moving average of parameters with diffusers' warm-up of the decay."""

    def __init__(self, parameters, decay: float = 0.9999, inv_gamma: float = 1.0, power: float = 2 / 3) -> None:
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay, self.inv_gamma, self.power = decay, inv_gamma, power
        self.optimization_step = 0
        self.cur_decay_value = 0.0

    def get_decay(self, optimization_step: int) -> float:
        step = max(0, optimization_step - 1)
        if step <= 0:
            return 0.0
        return min(1 - (1 + step / self.inv_gamma) ** -self.power, self.decay)

    @torch.no_grad()
    def step(self, parameters) -> None:
        self.optimization_step += 1
        self.cur_decay_value = self.get_decay(self.optimization_step)
        for shadow, param in zip(self.shadow_params, parameters):
            shadow.sub_((1 - self.cur_decay_value) * (shadow - param))

    def copy_to(self, parameters) -> None:
        for shadow, param in zip(self.shadow_params, parameters):
            param.data.copy_(shadow)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "inv_gamma": self.inv_gamma, "power": self.power,
                "optimization_step": self.optimization_step, "shadow_params": self.shadow_params}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.inv_gamma, self.power = state["decay"], state["inv_gamma"], state["power"]
        self.optimization_step = state["optimization_step"]
        self.shadow_params = [p.clone() for p in state["shadow_params"]]

    def to(self, device) -> None:
        self.shadow_params = [p.to(device) for p in self.shadow_params]

    def save_pretrained(self, folder: str, model: Denoiser) -> None:
        """The shadow weights as a model folder, the EMA's counters in its config (as diffusers does)."""
        saved = Denoiser(**model.config)
        self.copy_to(saved.parameters())
        saved.register_to_config(decay=self.decay, inv_gamma=self.inv_gamma, power=self.power,
                                 optimization_step=self.optimization_step)
        saved.save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, folder: str) -> EMAModel:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        model = Denoiser.from_pretrained(folder)
        ema = cls(model.parameters(), decay=config["decay"], inv_gamma=config["inv_gamma"], power=config["power"])
        ema.optimization_step = config["optimization_step"]
        return ema


class Images(torch.utils.data.Dataset):
    def __init__(self, resolution: int) -> None:
        self.images = torch.rand(16, 3, resolution, resolution, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"input": self.images[i]}


def add_noise(alphas_cumprod: torch.Tensor, images: torch.Tensor, noise: torch.Tensor,
              timesteps: torch.Tensor) -> torch.Tensor:
    scale = alphas_cumprod[timesteps].sqrt()[:, None, None, None]
    return scale * images + (1 - alphas_cumprod[timesteps]).sqrt()[:, None, None, None] * noise


def register_hooks(accelerator: Accelerator, args: argparse.Namespace, ema_model: EMAModel | None) -> bool:
    """The example's hooks, registered only where ``accelerate.__version__`` says they exist."""
    if version.parse(accelerate.__version__) < version.parse("0.16.0"):
        return False

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            if ema_model is not None:
                ema_model.save_pretrained(os.path.join(output_dir, "unet_ema"), models[0])
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()  # the model is saved: Accelerate must not save it again

    def load_model_hook(models, input_dir):
        if ema_model is not None:
            load_model = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"))
            ema_model.load_state_dict(load_model.state_dict())
            ema_model.to(accelerator.device)
        for _ in range(len(models)):
            model = models.pop()  # loaded here: Accelerate must not load it again
            load_model = Denoiser.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**load_model.config)
            model.load_state_dict(load_model.state_dict())

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)
    return True


def resume(accelerator: Accelerator, args: argparse.Namespace, num_update_steps_per_epoch: int) -> tuple[int, int, int]:
    """(global_step, first_epoch, resume_step) by the example's arithmetic."""
    if args.resume_from_checkpoint != "latest":
        path = os.path.basename(args.resume_from_checkpoint)
    else:
        dirs = sorted((d for d in os.listdir(args.output_dir) if d.startswith("checkpoint")),
                      key=lambda d: int(d.split("-")[1]))
        path = dirs[-1] if dirs else None
    if path is None:
        accelerator.print(f"Checkpoint '{args.resume_from_checkpoint}' does not exist. Starting a new training run.")
        args.resume_from_checkpoint = None
        return 0, 0, 0
    accelerator.print(f"Resuming from checkpoint {path}")
    accelerator.load_state(os.path.join(args.output_dir, path))
    global_step = int(path.split("-")[1])
    resume_global_step = global_step * args.gradient_accumulation_steps
    first_epoch = global_step // num_update_steps_per_epoch
    return global_step, first_epoch, resume_global_step % (num_update_steps_per_epoch * args.gradient_accumulation_steps)


def save_checkpoint(accelerator: Accelerator, args: argparse.Namespace, global_step: int) -> None:
    """Called on the main process only, as in the example."""
    if args.checkpoints_total_limit is not None:
        checkpoints = sorted((d for d in os.listdir(args.output_dir) if d.startswith("checkpoint")),
                             key=lambda d: int(d.split("-")[1]))
        if len(checkpoints) >= args.checkpoints_total_limit:
            for removing in checkpoints[:len(checkpoints) - args.checkpoints_total_limit + 1]:
                shutil.rmtree(os.path.join(args.output_dir, removing))
    save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
    accelerator.save_state(save_path)
    logger.info(f"Saved state to {save_path}")


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              project_config=ProjectConfiguration(project_dir=args.output_dir,
                                                                  logging_dir=os.path.join(args.output_dir, "logs")))
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
    model = Denoiser(num_train_timesteps=args.ddpm_num_steps)
    ema_model = (EMAModel(model.parameters(), decay=args.ema_max_decay, inv_gamma=args.ema_inv_gamma,
                          power=args.ema_power) if args.use_ema else None)
    hooks = register_hooks(accelerator, args, ema_model)
    alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.02, args.ddpm_num_steps), dim=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-6)
    train_dataloader = torch.utils.data.DataLoader(Images(args.resolution), batch_size=args.train_batch_size,
                                                   shuffle=True)
    total = len(train_dataloader) * args.num_epochs
    warmup = args.lr_warmup_steps * args.gradient_accumulation_steps
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.5 * (
        1 + math.cos(math.pi * max(0, s - warmup) / max(1, total - warmup)))))
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
    if ema_model is not None:
        ema_model.to(accelerator.device)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    global_step, first_epoch, resume_step = 0, 0, 0
    if args.resume_from_checkpoint:
        global_step, first_epoch, resume_step = resume(accelerator, args, num_update_steps_per_epoch)
    skipped = 0
    for epoch in range(first_epoch, args.num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            if args.resume_from_checkpoint and epoch == first_epoch and step < resume_step:
                skipped += 1
                continue
            clean_images = batch["input"]
            noise = torch.randn(clean_images.shape, device=clean_images.device)
            timesteps = torch.randint(0, args.ddpm_num_steps, (clean_images.shape[0],),
                                      device=clean_images.device).long()
            noisy_images = add_noise(alphas_cumprod.to(clean_images.device), clean_images, noise, timesteps)
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(noisy_images, timesteps).float(), noise.float())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                if ema_model is not None:
                    ema_model.step(model.parameters())
                global_step += 1
                if global_step % args.checkpointing_steps == 0 and accelerator.is_main_process:
                    save_checkpoint(accelerator, args, global_step)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unet = accelerator.unwrap_model(model)
        save_file({k: v.contiguous() for k, v in unet.state_dict().items()},
                  os.path.join(args.output_dir, "model.safetensors"))
        if ema_model is not None:
            ema_model.copy_to(unet.parameters())
            save_file({k: v.contiguous() for k, v in unet.state_dict().items()},
                      os.path.join(args.output_dir, "ema.safetensors"))
        results = {"global_step": global_step, "skipped": skipped, "first_epoch": first_epoch,
                   "hooks_registered": hooks, "num_processes": accelerator.num_processes,
                   "ema_step": ema_model.optimization_step if ema_model is not None else None,
                   "logged": {"accelerate_version": accelerate.__version__,
                              "distributed_type": str(accelerator.distributed_type)}}
        with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
            json.dump(results, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
