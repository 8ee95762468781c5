"""Moving one named parameter or buffer of a module between devices, optionally giving it a new value.

This is the single primitive every loader and hook here uses: a parameter keeps its class and its
``requires_grad``; a value must have the shape of the tensor it replaces; a meta tensor can only leave the
meta device with a value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["set_module_tensor_to_device", "resolve_device", "module_and_leaf"]


def resolve_device(device: torch.device | str | int) -> torch.device:
    """``0`` -> the first accelerator (``cuda:0``, ``xpu:0``...), ``"cpu"`` -> ``torch.device("cpu")``."""
    if isinstance(device, int):
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        if accelerator is None:
            raise ValueError(f"device {device} is an accelerator index, but this machine has no accelerator; "
                             f"use 'cpu' (or 'disk' in a device_map)")
        return torch.device(accelerator.type, device)
    if device == "disk":
        raise ValueError("'disk' is a place in a device_map, not a device tensors can be moved to")
    return torch.device(device)


def module_and_leaf(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """``(model.layers[0].mlp, "weight")`` for ``"layers.0.mlp.weight"``; a clear error if a part is missing."""
    owner_name, _, leaf = tensor_name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name) if owner_name else module
    except AttributeError as err:
        raise ValueError(f"{type(module).__name__} has no submodule {owner_name!r} (looking for {tensor_name!r})"
                         ) from err
    if leaf not in owner._parameters and leaf not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} ({owner_name or 'the model'}) has no parameter or buffer "
                         f"named {leaf!r} (looking for {tensor_name!r})")
    return owner, leaf


def _cast(value: torch.Tensor, old: torch.Tensor, dtype: torch.dtype | str | None) -> torch.Tensor:
    if dtype is None:
        # what nn.Module.load_state_dict does: the model's dtype wins
        return value.to(old.dtype)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    if value.is_floating_point():
        return value.to(dtype)
    return value  # ids, masks and packed integers are never cast


def _tied_copy(tied_params_map: dict | None, tensors: tuple[Any, ...], key: Any) -> torch.Tensor | None:
    if tied_params_map is None:
        return None
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            copies = tied_params_map.get(tensor.data_ptr())
            if copies is not None and key in copies:
                return copies[key]
    return None


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device: torch.device | str | int,
                                value: Any = None, dtype: torch.dtype | str | None = None,
                                fp16_statistics: torch.Tensor | None = None, tied_params_map: dict | None = None,
                                non_blocking: bool = False, clear_cache: bool = True) -> None:
    """Put ``module``'s tensor ``tensor_name`` (dotted) on ``device``, with ``value`` as its data if given.

    ``dtype`` casts floating values (default: the dtype the tensor has now). ``tied_params_map``
    (``{data_ptr: {device: tensor}}``) lets tied weights share one copy on a device.
    ``fp16_statistics`` and ``clear_cache`` are accepted for Accelerate compatibility.
    """
    owner, leaf = module_and_leaf(module, tensor_name)
    is_buffer = leaf in owner._buffers
    old = owner._buffers[leaf] if is_buffer else owner._parameters[leaf]
    if old is None:
        raise ValueError(f"{tensor_name!r} is None in {type(owner).__name__}; there is nothing to move")
    reused = _tied_copy(tied_params_map, (value, old), device)
    if reused is not None and not is_buffer:
        # torch types _parameters as Parameter | None; this is a Parameter made by this function
        owner._parameters[leaf] = reused  # pyright: ignore[reportArgumentType]
        return
    target = torch.device("meta") if str(device) == "meta" else resolve_device(device)
    if old.device.type == "meta" and target.type != "meta" and value is None:
        raise ValueError(f"{tensor_name!r} is on the meta device (it has no data); give a value to put it on "
                         f"{device}")
    with torch.no_grad():
        if value is None:
            new = old.to(target, non_blocking=non_blocking)
            if dtype is not None and target.type == "meta":
                new = _cast(new, old, dtype)
        else:
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            if value.shape != old.shape:
                raise ValueError(f"cannot set {tensor_name!r}: the new value has shape {tuple(value.shape)}, "
                                 f"the model expects {tuple(old.shape)}")
            new = _cast(value, old, dtype).to(target, non_blocking=non_blocking)
    if is_buffer:
        owner._buffers[leaf] = new
    elif new is not old:
        param = type(old)(new, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else new
        if isinstance(old, nn.Parameter):  # keep attributes set on the parameter (quantization state...)
            for key, item in vars(old).items():
                if not hasattr(param, key):
                    setattr(param, key, item)
        # a Parameter unless it was a plain tensor (torch types _parameters as Parameter | None)
        owner._parameters[leaf] = param  # pyright: ignore[reportArgumentType]
        new = param
    _remember_tied(tied_params_map, (old, value), device, new)


def _remember_tied(tied_params_map: dict | None, sources: tuple[Any, ...], key: Any, new: torch.Tensor) -> None:
    if tied_params_map is None:
        return
    for source in sources:
        if isinstance(source, torch.Tensor) and source.device.type != "meta":
            copies = tied_params_map.get(source.data_ptr())
            if copies is not None and key not in copies:
                copies[key] = new
                return
