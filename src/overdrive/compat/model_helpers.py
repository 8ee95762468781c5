"""Accelerate's helpers over models and their state dicts (``accelerate.utils.other`` and
``accelerate.utils.modeling``): compiled or DTensor models, tensor-parallel size, module walks, PEFT models,
safe state-dict saving and loading, the grad scaler and autocast block of the running configuration.

Each works (none is a placeholder); those needing a feature overdrive lacks live in ``compat.refusals``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from overdrive.helpers.imports import is_peft_available
from overdrive.runtime import group
from overdrive.runtime.torch_private import compiled_wrapper_inner
from overdrive.training.state import AcceleratorState


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile`` returns."""
    return compiled_wrapper_inner(module) is not None


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether some submodule (not ``module`` itself) was compiled with ``torch.compile``."""
    return any(is_compiled_module(child) for child in module.modules() if child is not module)


def model_has_dtensor(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor (FSDP2 / tensor parallel); False on a torch built without
    torch.distributed, where DTensor cannot be imported. The availability check is looked up when called, through
    ``accelerate.utils.other``, where tests patch it as they do with Accelerate."""
    if not importlib.import_module("overdrive.utils.other").is_torch_distributed_available():
        return False
    from torch.distributed.tensor import DTensor  # lazy: a torch built without torch.distributed has none

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with (``model.tp_size`` before
    transformers 5, ``model.config.distributed_config.tp_size`` from 5 on), else that of its DTensor
    parameters on a mesh with a ``tp`` axis, else None."""
    recorded = getattr(model, "tp_size", None)
    if recorded is not None:
        return recorded
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    recorded = config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)
    if recorded is not None:
        return recorded
    from torch.distributed.tensor import DTensor  # lazy: a torch built without torch.distributed has none

    for param in model.parameters():
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or ()
            if "tp" in names:
                return param.device_mesh["tp"].size()
    return None


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop the names whose tensors share storage with an earlier name (safetensors refuses them), with a
    warning naming them, and make the rest contiguous."""
    seen: dict[tuple[Any, int], str] = {}
    clean: dict[str, Any] = {}
    removed: list[str] = []
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            key = (value.device, value.untyped_storage().data_ptr())
            if value.numel() and key in seen:
                removed.append(name)
                continue
            seen[key] = name
            value = value.contiguous()
        clean[name] = value
    if removed:
        logging.getLogger(__name__).warning(
            "Removed shared tensor %s while saving (each shares its storage with a tensor kept under another "
            "name); loading the file back ties them only if the model ties them itself", removed)
    return clean


def save(obj: Any, f: str | os.PathLike, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Save on the main process (of each machine with ``save_on_each_node``), torch.save or safetensors."""
    if group.is_initialized():
        rank = group.local_rank() if save_on_each_node else group.rank()
        if rank != 0:
            return
    if safe_serialization:
        save_file(clean_state_dict_for_safetensors(obj), str(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: str | os.PathLike, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless the caller says otherwise."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every submodule of ``model``, children before their parents, ``model`` last."""
    order: list[Any] = []

    def visit(module: nn.Module, name: str) -> None:
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)
        order.append((name, module) if return_fqns else module)

    visit(model, "")
    return order


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (PEFT installed and the model a ``PeftModel``)."""
    if not is_peft_available():
        return False
    from peft import PeftModel  # lazy: optional dependency

    return isinstance(model, PeftModel)


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A ``GradScaler`` for this machine's device (FSDP: torch's sharded one), built with ``kwargs``."""
    if str(distributed_type) == "FSDP":
        # lazy: loads torch's FSDP package, which only an FSDP run needs
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return torch.amp.GradScaler(device.type if device is not None else "cpu", **kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """The autocast block of the running Accelerator's mixed precision (a no-op without ``native_amp``)."""
    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
    if not native_amp or state.mixed_precision not in dtypes:
        return contextlib.nullcontext()
    return torch.autocast(device_type=state.device.type, dtype=dtypes[state.mixed_precision], **kwargs)


def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Accelerate's check before Ulysses sequence parallelism: a ``ValueError`` naming the layer types of
    ``model.config.layer_types`` that carry a recurrent state along the sequence (linear attention), which a
    sharded sequence would restart on every rank. (overdrive refuses sequence parallelism itself; the check is
    kept for code that calls it.)"""
    config: Any = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    recurrent = sorted({kind for kind in layer_types if "linear_attention" in kind})
    if recurrent:
        raise ValueError(f"sequence parallelism cannot shard layers of type {recurrent} (model "
                         f"{type(model).__name__}): they carry a recurrent state along the sequence, which every "
                         "rank would restart; use a full-attention model or no sequence parallelism")
