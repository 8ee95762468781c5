"""``save_fsdp_model`` / ``load_fsdp_model`` / ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` /
``merge_fsdp_weights`` with Accelerate's signatures, over the checkpoint package's one-folder DCP save and
load (:mod:`overdrive.checkpoint.folder`: published atomically, read safely, a failed load changes nothing).

Each process writes and reads its own shards (any model: FSDP2, DDP or plain), so a folder written at
one world size loads at another. ``merge_fsdp_weights`` is overdrive's ``merge-weights``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from overdrive.checkpoint.export import merge_weights
from overdrive.checkpoint.folder import load_folder, save_folder
from overdrive.compat.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME


def _folder(root: str | os.PathLike, stem: str, index: int) -> Path:
    """Accelerate's sharded folder, ``<root>/<stem>_<index>``; ``root`` may name that folder itself (as
    Accelerate accepts), and ``<root>/<stem>`` (what overdrive wrote before) is read when it is the one there."""
    name = f"{stem}_{index}"
    root = Path(root)
    if root.name == name:
        return root
    if index == 0 and not (root / name).exists() and (root / stem / ".metadata").is_file():
        return root / stem
    return root / name


def _options() -> Any:
    return StateDictOptions(full_state_dict=False)


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: nn.Module, output_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> None:
    """Write ``model``'s (sharded) state to ``output_dir/pytorch_model_fsdp[_<index>]``; call on every process.
    The folder appears only once every process wrote its part (an older one is replaced then)."""

    state = get_model_state_dict(_inner(model), options=_options())
    if adapter_only:
        state = _adapters(state)
    save_folder({"model": state}, _folder(output_dir, FSDP_MODEL_NAME, model_index), "save_fsdp_model")


def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: nn.Module, input_dir: str | os.PathLike,
                    model_index: int = 0, adapter_only: bool = False) -> None:
    """Read what ``save_fsdp_model`` wrote into ``model`` (at this or another number of processes); a read
    that fails leaves ``model`` as it was."""

    folder = _folder(input_dir, FSDP_MODEL_NAME, model_index)
    if not folder.is_dir():
        raise FileNotFoundError(f"no FSDP model checkpoint at {folder}; write one with save_fsdp_model")
    inner = _inner(model)
    state = get_model_state_dict(inner, options=_options())
    if adapter_only:
        state = _adapters(state)
    loaded = load_folder({"model": state}, folder, what="load_fsdp_model")
    set_model_state_dict(inner, loaded["model"], options=StateDictOptions(strict=not adapter_only))


def save_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: nn.Module,
                        output_dir: str | os.PathLike, optimizer_index: int = 0) -> None:
    """Write ``optimizer``'s (sharded) state to ``output_dir/optimizer[_<index>]``; call on every process."""

    inner_optimizer = getattr(optimizer, "optimizer", optimizer)
    state = get_optimizer_state_dict(_inner(model), inner_optimizer, options=_options())
    save_folder({"optimizer": state}, _folder(output_dir, OPTIMIZER_NAME, optimizer_index), "save_fsdp_optimizer")


def load_fsdp_optimizer(fsdp_plugin: Any, accelerator: Any, optimizer: Any, model: nn.Module,
                        input_dir: str | os.PathLike, optimizer_index: int = 0, adapter_only: bool = False) -> None:
    """Read what ``save_fsdp_optimizer`` wrote into ``optimizer``; a read that fails leaves it as it was."""

    folder = _folder(input_dir, OPTIMIZER_NAME, optimizer_index)
    if not folder.is_dir():
        raise FileNotFoundError(f"no FSDP optimizer checkpoint at {folder}; write one with save_fsdp_optimizer")
    inner_optimizer = getattr(optimizer, "optimizer", optimizer)
    inner = _inner(model)
    state = {"optimizer": get_optimizer_state_dict(inner, inner_optimizer, options=_options())}
    loaded = load_folder(state, folder, what="load_fsdp_optimizer")
    set_optimizer_state_dict(inner, inner_optimizer, loaded["optimizer"], options=_options())


def _adapters(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if "lora_" in k or "adapter" in k}


def merge_fsdp_weights(checkpoint_dir: str | os.PathLike, output_path: str | os.PathLike,
                       safe_serialization: bool = True, remove_checkpoint_dir: bool = False) -> None:
    """Merge a sharded model checkpoint into one full set of weights in ``output_path``.

    ``checkpoint_dir`` is a ``save_fsdp_model`` folder (``pytorch_model_fsdp_0``-style) or an overdrive
    ``save_state`` folder."""
    source = Path(checkpoint_dir)
    if (source / "manifest.json").is_file() or not (source / ".metadata").is_file():
        merge_weights(source, output_path, safe_serialization=safe_serialization)
    else:
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        scratch = out / "_merged.pt"
        dcp_to_torch_save(str(source), str(scratch))
        state = torch.load(scratch, weights_only=True)
        scratch.unlink()
        weights = state.get("model", state)
        if weights and all(key.startswith("model.") for key in weights):  # written flat by save_fsdp_model
            weights = {key[len("model."):]: value for key, value in weights.items()}
        if safe_serialization:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
                      metadata={"format": "pt"})
        else:
            torch.save(weights, out / "pytorch_model.bin")
    if remove_checkpoint_dir:
        shutil.rmtree(source)


def get_module_class_from_name(module: nn.Module, name: str) -> type | None:
    """The class called ``name`` among ``module`` and its submodules (depth first), or None (PEFT resolves
    FSDP wrap classes by name with it)."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None


def get_parameters_from_modules(modules: Any, model: nn.Module, device: Any) -> set[nn.Parameter]:
    """The parameters of ``modules``: modules, or a regular expression matched against ``model``'s submodule
    names (those are moved to ``device`` first, as Accelerate does). None gives an empty set (TRL reads the
    FSDP plugin's ``ignored_modules`` with it)."""
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        modules = [sub.to(device) for name, sub in model.named_modules() if pattern.fullmatch(name)]
    return {param for sub in modules for param in sub.parameters()}


def _ram_efficient_loading(value: str) -> Callable[[], None]:
    def switch() -> None:
        # Accelerate's FSDP plugin reads this variable when built; ours reads it in the resolver.
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = value

    switch.__name__ = "enable_fsdp_ram_efficient_loading" if value == "True" else "disable_fsdp_ram_efficient_loading"
    switch.__doc__ = f"Set FSDP_CPU_RAM_EFFICIENT_LOADING={value} for FSDP plugins built afterwards."
    return switch


enable_fsdp_ram_efficient_loading = _ram_efficient_loading("True")
disable_fsdp_ram_efficient_loading = _ram_efficient_loading("False")
