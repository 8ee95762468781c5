"""State dicts of models whose weights are offloaded (on the meta device between forwards)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from overdrive.big_model.hooks import align_module_device, has_offloaded_params

logger = logging.getLogger(__name__)

__all__ = ["get_state_dict_offloaded_model", "get_state_dict_from_offload"]


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of ``model`` on the CPU, bringing offloaded modules in one at a time."""
    state: dict[str, torch.Tensor] = {}
    placeholders = set()
    for name, module in model.named_modules():
        if not name:
            continue
        with align_module_device(module, "cpu"):
            own = module.state_dict()
        for key, tensor in own.items():
            if tensor.device.type == "meta":
                placeholders.add(f"{name}.{key}")
            else:
                state[f"{name}.{key}"] = tensor.to("cpu")
    missing = placeholders - set(state)
    if missing:
        logger.warning("These tensors were left out: they are still on the meta device: %s", sorted(missing))
    return state


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict[str, Any],
                                device_to_put_offload: Any = "cpu") -> dict[str, Any]:
    """Fill the entries of ``state_dict`` belonging to ``module`` (named by one of its tensors,
    ``module_name``) with its weights, brought to ``device_to_put_offload`` if offloaded."""
    root = module_name[: module_name.rfind(".")]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict
