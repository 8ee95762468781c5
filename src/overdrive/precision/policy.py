"""What a mixed-precision name means: which dtypes compute, hold the weights, reduce, and whether loss
scaling is needed. Strategies read this value; nothing else branches on the name."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from overdrive.config.choices import MIXED_PRECISION, invalid_choice

# fp8: torchao / Transformer Engine run the linear layers in float8 (precision/fp8.py); the rest runs in bf16,
# as in Accelerate
_DTYPES = {"no": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class PrecisionPolicy:
    name: str = "no"
    #: dtype that autocast computes in (None: full precision).
    compute_dtype: torch.dtype | None = None
    #: dtype of the master weights and optimizer state: always fp32 for mixed precision.
    param_dtype: torch.dtype = torch.float32
    #: dtype gradients are reduced in across processes.
    reduce_dtype: torch.dtype = torch.float32
    #: fp16's narrow range needs a dynamic loss scale.
    loss_scaling: bool = False

    @property
    def enabled(self) -> bool:
        """Whether autocast runs (a compute dtype is set)."""
        return self.compute_dtype is not None


def precision_policy(name: str | None, device: torch.device) -> PrecisionPolicy:
    """The policy for ``name`` on ``device`` (None: 'no'), or an error naming the value and the valid choices."""
    key = str(getattr(name, "value", name)).lower() if name is not None else "no"
    if key not in _DTYPES:
        raise ValueError(invalid_choice(f"mixed_precision={name!r}", key, MIXED_PRECISION))
    dtype = _DTYPES[key]
    if dtype is None:
        return PrecisionPolicy()
    problem = _unsupported(dtype, device)
    if problem:
        raise ValueError(f"mixed_precision={name!r} cannot run on {device}: {problem}; use 'no' or "
                         f"{'bf16' if key == 'fp16' else 'fp16'} if the device supports it")
    return PrecisionPolicy(name=key, compute_dtype=dtype, loss_scaling=dtype == torch.float16)


def _unsupported(dtype: torch.dtype, device: torch.device) -> str | None:
    if not torch.amp.is_autocast_available(device.type):
        return f"torch has no autocast for device type {device.type!r}"
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bfloat16"
    return None
