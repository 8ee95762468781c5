"""Accelerate's small helpers from ``accelerate.utils.other`` / ``versions`` / ``commands.config``.

Each works (none is a placeholder); those needing a feature overdrive lacks live in ``compat.refusals``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version, parse
from torch import nn

from overdrive.compat.constants import STR_OPERATION_TO_FUNC
from overdrive.config.choices import invalid_choice


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """``library_or_version <operation> requirement_version``; a name is looked up as an installed package."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(invalid_choice(f"operation {operation!r}", operation, sorted(STR_OPERATION_TO_FUNC)))
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return bool(STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the running torch's base version satisfies ``<operation> version``."""
    return compare_versions(parse(parse(torch.__version__).base_version), operation, version)


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile`` returns."""
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule) if hasattr(torch, "_dynamo") else False


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether some submodule (not ``module`` itself) was compiled with ``torch.compile``."""
    return any(is_compiled_module(child) for child in module.modules() if child is not module)


def model_has_dtensor(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor (FSDP2 / tensor parallel); False on a torch built without
    torch.distributed, where DTensor cannot be imported. The availability check is looked up when called, through
    ``accelerate.utils.other``, where tests patch it as they do with Accelerate."""
    if not importlib.import_module("overdrive.utils.other").is_torch_distributed_available():
        return False
    from torch.distributed.tensor import DTensor

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
    from torch.distributed.tensor import DTensor

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
    from overdrive.runtime import group

    if group.is_initialized():
        rank = group.local_rank() if save_on_each_node else group.rank()
        if rank != 0:
            return
    if safe_serialization:
        from safetensors.torch import save_file

        save_file(clean_state_dict_for_safetensors(obj), str(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: str | os.PathLike, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless the caller says otherwise."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def get_pretty_name(obj: Any) -> str:
    """The qualified name of ``obj`` (or of its class)."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge ``source`` into ``destination`` recursively (nested dicts merge, other values overwrite)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``port`` (default 29500) on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port or 29500)) == 0


def get_free_port() -> int:
    """A free TCP port on this machine."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def convert_bytes(size: float) -> str:
    """``size`` bytes as '1.5 KB' style text."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def check_os_kernel() -> None:
    """Warn when the Linux kernel is older than 5.5 (processes can hang there)."""
    import logging
    import platform

    info = platform.uname()
    if info.system == "Linux":
        version = parse(info.release.split("-")[0])
        if version < parse("5.5.0"):
            logging.getLogger(__name__).warning(
                f"Linux kernel {version} is below 5.5.0, the recommended minimum; processes may hang")


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
    from overdrive.helpers.imports import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


# -- commands.config ---------------------------------------------------------------------------------------
def _default_config_file() -> str:
    from overdrive.launchers.config_file import default_config_path

    return str(default_config_path())


default_config_file = _default_config_file()


def load_config_from_file(config_file: str | os.PathLike | None = None) -> Any:
    """The launch config (``config_file``, else the default one) as Accelerate's record of it: a
    ``ClusterConfig``, or a ``SageMakerConfig`` for ``compute_environment: AMAZON_SAGEMAKER``."""
    from overdrive.compat.cli_commands import config_record
    from overdrive.launchers import config_file as cf

    source = cf.find_config(config_file)
    if source.path is None or not source.path.is_file():
        raise FileNotFoundError(f"no launch config file at {config_file or source.describe()}; "
                                "write one with 'overdrive config' or write_basic_config()")
    return config_record(cf.load_config(source.path))


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike | None = None) -> Path | bool:
    """Write a one-machine config file using every local device (``overdrive config default``); returns
    its path, or False (and changes nothing) when a file is already there."""
    from overdrive.config.launch_settings import MIXED_PRECISION
    from overdrive.launchers import config_file as cf

    path = Path(save_location or cf.default_config_path()).expanduser()
    if path.exists():
        print(f"Configuration already exists at {path}, will not override. Run `overdrive config` or pass "
              "another save_location.")
        return False
    precision = str(mixed_precision).lower()
    if precision not in MIXED_PRECISION:
        raise ValueError(invalid_choice(f"mixed_precision={mixed_precision!r}", mixed_precision, MIXED_PRECISION))
    count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
    accelerator = torch.accelerator.current_accelerator() if count else None
    kind = accelerator.type if accelerator is not None else "cpu"
    return cf.save_config(cf.basic_config(precision, device_count=count, device_type=kind), path)


def _ram_efficient_loading(value: str) -> Callable[[], None]:
    def switch() -> None:
        # Accelerate's FSDP plugin reads this variable when built; ours reads it in the resolver.
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = value

    switch.__name__ = "enable_fsdp_ram_efficient_loading" if value == "True" else "disable_fsdp_ram_efficient_loading"
    switch.__doc__ = f"Set FSDP_CPU_RAM_EFFICIENT_LOADING={value} for FSDP plugins built afterwards."
    return switch


enable_fsdp_ram_efficient_loading = _ram_efficient_loading("True")
disable_fsdp_ram_efficient_loading = _ram_efficient_loading("False")


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """A ``GradScaler`` for this machine's device (FSDP: torch's sharded one), built with ``kwargs``."""
    if str(distributed_type) == "FSDP":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return torch.amp.GradScaler(device.type if device is not None else "cpu", **kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """The autocast block of the running Accelerator's mixed precision (a no-op without ``native_amp``)."""
    import contextlib

    from overdrive.training.state import AcceleratorState

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
