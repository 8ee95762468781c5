"""The Accelerator on a CUDA device, compared with plain PyTorch on the same device: placement, bf16 autocast,
fp16 loss scaling, and scripts/gpu_check.py's layouts on every visible GPU. Marked ``gpu``: skipped (by
tests/conftest.py) on a machine without CUDA, so CI on CPUs runs none of it; run them on a GPU machine with
``pytest -m gpu``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tests.accelerator.test_accelerator_distributed import loss_fn, make_data, make_model

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _reference(dtype: torch.dtype | None, steps: int = 5) -> tuple[list[float], list[torch.Tensor]]:
    """Plain PyTorch on cuda:0: AdamW over batches of 8, under autocast to ``dtype`` when one is given (fp16
    with torch's GradScaler)."""
    model = make_model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda", init_scale=256) if dtype == torch.float16 else None
    losses = []
    for x, y in DataLoader(make_data(8 * steps), batch_size=8):
        x, y = x.cuda(), y.cuda()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model, x, y)
        losses.append(loss.item())
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
    return losses, [p.detach().float().cpu() for p in model.parameters()]


def _accelerated(mixed_precision: str, steps: int = 5) -> tuple[list[float], list[torch.Tensor], str]:
    from overdrive import Accelerator, GradScalerKwargs

    accelerator = Accelerator(mixed_precision=mixed_precision, kwargs_handlers=[GradScalerKwargs(init_scale=256)])
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(make_data(8 * steps), batch_size=8))
    losses = []
    for x, y in loader:
        loss = loss_fn(model, x, y)
        losses.append(loss.item())
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    device = str(next(model.parameters()).device)
    weights = [p.detach().float().cpu() for p in accelerator.unwrap_model(model).parameters()]
    accelerator.free_memory()
    return losses, weights, device


@pytest.mark.parametrize(("mixed_precision", "dtype", "tolerance"),
                         [("no", None, 1e-5), ("bf16", torch.bfloat16, 1e-2), ("fp16", torch.float16, 1e-3)])
def test_one_gpu_trains_like_plain_pytorch_on_that_gpu(mixed_precision, dtype, tolerance):
    losses, weights, device = _accelerated(mixed_precision)
    ref_losses, ref_weights = _reference(dtype)
    assert device == "cuda:0"  # prepare() placed the model and the batches on the GPU
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= tolerance, (losses, ref_losses)
    assert max((a - b).abs().max().item() for a, b in zip(weights, ref_weights)) <= tolerance


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_check_layouts_match_one_device():
    """scripts/gpu_check.py: every parallel layout that fits the visible GPUs against one device (NCCL)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")], cwd=ROOT,
                            capture_output=True, text=True, timeout=840)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
