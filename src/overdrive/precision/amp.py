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
        if not self.policy.enabled or not self.autocast_kwargs.enabled:
            return []
        stack: list[Any] = []  # None: a forward without autocast; else what its exit restores
        # Decided once: these hooks run on every forward.
        kwargs: dict[str, Any] = {"device_type": self.device.type, "dtype": self.policy.compute_dtype}
        if self.autocast_kwargs.cache_enabled is not None:
            kwargs["cache_enabled"] = self.autocast_kwargs.cache_enabled
        traced_args = (kwargs["device_type"], kwargs["dtype"], True, kwargs.get("cache_enabled"))
        region = torch.autocast(**kwargs)  # torch settles the region's settings (support checks, warnings)
        device, dtype, enabled, cache = region.device, region.fast_dtype, region._enabled, region._cache_enabled
        low = (torch.float16, torch.bfloat16)

        def enter(module: nn.Module, args: Any) -> None:
            if not self.active:  # native_amp = False: this forward runs in full precision
                stack.append(None)
            elif module._compiled_call_impl is not None:
                # compiled in place: dynamo traces these hooks, and it follows autocast entered and left in
                # two functions only in this form (an autocast object entered here fails at __exit__)
                stack.append(torch.amp._enter_autocast(*traced_args))
            elif torch._C._is_torch_function_mode_enabled():  # export's mode sees autocast as an object only
                opened = torch.autocast(**kwargs)
                opened.__enter__()
                stack.append(opened)
            else:
                # torch.autocast.__enter__'s own steps, as C calls: no Python frame on every forward
                stack.append((torch.is_autocast_cache_enabled(), torch.is_autocast_enabled(device),
                              torch.get_autocast_dtype(device)))
                torch.set_autocast_enabled(device, enabled)
                torch.set_autocast_dtype(device, dtype)
                torch.autocast_increment_nesting()
                torch.set_autocast_cache_enabled(cache)

        def leave(module: nn.Module, args: Any, output: Any) -> Any:
            opened = stack.pop()
            if opened is None:
                return output
            if type(opened) is tuple:  # torch.autocast.__exit__'s steps
                if torch.autocast_decrement_nesting() == 0:
                    torch.clear_autocast_cache()
                torch.set_autocast_enabled(device, opened[1])
                torch.set_autocast_dtype(device, opened[2])
                torch.set_autocast_cache_enabled(opened[0])
            elif module._compiled_call_impl is not None:
                torch.amp._exit_autocast(opened)
            else:
                opened.__exit__(None, None, None)
            if type(output) is torch.Tensor:  # the common case, without walking a structure
                return output.float() if output.dtype in low else output
            return convert_to_fp32(output)

        return [model.register_forward_pre_hook(enter),
                model.register_forward_hook(leave, always_call=True)]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, through the gradient scaler under fp16."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)
