"""Mixed precision by autocast around each prepared model's forward, with a GradScaler for fp16.

The autocast region is opened by a forward pre-hook and closed by a forward hook that always runs, so
the user's model object, its class and its ``forward`` stay untouched; floating outputs come back in fp32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from overdrive.config import AutocastKwargs, GradScalerKwargs
from overdrive.helpers.ops import convert_to_fp32
from overdrive.precision.policy import PrecisionPolicy
from overdrive.runtime.torch_private import autocast_hooks


class AmpPrecision:
    """Runs a ``PrecisionPolicy`` with ``torch.autocast`` and ``torch.amp.GradScaler``."""

    def __init__(self, policy: PrecisionPolicy, device: torch.device, autocast: AutocastKwargs,
                 scaler: GradScalerKwargs) -> None:
        self.policy = policy
        self.device = device
        self.autocast_kwargs = autocast
        #: whether the attached forward hooks open autocast (Accelerate's settable ``native_amp``)
        self.active = True
        self.scaler: torch.amp.GradScaler | None = None
        if policy.loss_scaling and scaler.enabled:
            self.scaler = torch.amp.GradScaler(device.type, **scaler.to_kwargs())

    def autocast(self, handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager:
        """The autocast region for this policy (a no-op for full precision)."""
        handler = handler or self.autocast_kwargs
        if not self.policy.enabled or not handler.enabled or not self.active:
            return contextlib.nullcontext()
        kwargs: dict[str, Any] = {"dtype": self.policy.compute_dtype}
        if handler.cache_enabled is not None:
            kwargs["cache_enabled"] = handler.cache_enabled
        return torch.autocast(device_type=self.device.type, **kwargs)

    def attach(self, model: nn.Module) -> list[RemovableHandle]:
        """Run ``model``'s forward under autocast and return its floating outputs in fp32."""
        dtype = self.policy.compute_dtype
        if dtype is None or not self.autocast_kwargs.enabled:
            return []
        # the hooks read ``self.active`` (Accelerate's settable ``native_amp``) at every forward
        enter, leave = autocast_hooks(self.device.type, dtype, self.autocast_kwargs.cache_enabled, self,
                                      convert_to_fp32)
        return [model.register_forward_pre_hook(enter), model.register_forward_hook(leave, always_call=True)]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, through the gradient scaler under fp16."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)
