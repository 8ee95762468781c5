"""Accelerate helpers that scripts and libraries call directly although Accelerate uses them inside its own
``prepare`` / ``save_state`` / launcher: each does what Accelerate's does, over overdrive's objects."""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import os
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from overdrive.checkpoint.accelerate_format import load_accelerate_checkpoint
from overdrive.compat.cli_launch import prepare_multi_gpu_env
from overdrive.compat.environment_checks import get_free_port
from overdrive.compat.fsdp import get_module_class_from_name
from overdrive.compat.model_helpers import load, save
from overdrive.config.enums import DistributedType
from overdrive.data import IterableDatasetShard, SeedableRandomSampler
from overdrive.helpers.imports import get_torch_accelerator_backend
from overdrive.helpers.logging import get_logger
from overdrive.training.state import PartialState
from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing
from overdrive.transforms.blocks import blocks_to_wrap

logger = get_logger("accelerate.checkpointing")


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


def save_custom_state(obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False) -> None:
    """Save ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (the file ``save_state`` writes
    for an object given to ``register_for_checkpointing``)."""
    location = Path(path) / f"custom_checkpoint_{index}.pkl"
    logger.info(f"Saving the state of {get_pretty_name(obj)} to {location}")
    save(obj.state_dict(), location, save_on_each_node=save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict`` (the file may hold any
    picklable state: it is read with ``weights_only=False``, so load only files you trust)."""
    location = Path(path) / f"custom_checkpoint_{index}.pkl"
    logger.info(f"Loading the state of {get_pretty_name(obj)} from {location}")
    obj.load_state_dict(load(location, map_location="cpu", weights_only=False))


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` built with ``kwargs`` (what fp16 under FSDP2 scales losses with)."""
    return torch.amp.GradScaler(**kwargs)


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """``named_params`` with the name parts activation checkpointing (``._checkpoint_wrapped_module``) and
    ``torch.compile`` (``_orig_mod.``) add removed, so the names match the plain model's."""
    names = {k.replace("._checkpoint_wrapped_module", ""): v for k, v in named_params.items()}
    names = {(k.replace("_orig_mod.", "") if k.startswith("_orig_mod.") else k): v for k, v in names.items()}
    return {k.replace("._orig_mod", ""): v for k, v in names.items()}


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point ``optimizer`` at new parameters in place: ``mapping`` takes each current parameter's
    ``data_ptr`` to its replacement (a sharded parameter). A parameter without one is ``KeyError``: training on
    with the old one would silently not update the model."""
    try:
        for group in optimizer.param_groups:
            group["params"] = [mapping[p.data_ptr] for p in group["params"]]
    except KeyError:
        raise KeyError("a parameter of the optimizer has no replacement in `mapping` (keyed by data_ptr): the "
                       "optimizer would keep updating a parameter the model no longer uses") from None


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel settings object; asynchronous TP is not supported (a warning) and the
    size is ``ParallelismConfig(tp_size=...)``."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.", stacklevel=3)


class DeepSpeedEngineWrapper:
    """A DeepSpeed engine driven as a plain loop drives a model: ``backward(loss)`` runs the engine's backward
    and, at the end of an accumulation window (``sync_gradients``), its step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """The engine's backward; its step when ``sync_gradients`` (the engine zeroes the gradients itself)."""
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The engine's last global gradient norm, as a number."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class PrepareForLaunch:
    """``launcher`` made startable as process ``index`` of a forked group: sets ``LOCAL_RANK`` / ``RANK`` (from
    ``NPROC`` and ``NODE_RANK``) for a multi-process ``distributed_type``, or, for a ``debug`` launch, joins a
    gloo group through the file store ``ACCELERATE_DEBUG_RDV_FILE``; then calls ``launcher(*args)``."""

    def __init__(self, launcher: Callable[..., Any], distributed_type: Any = "NO", debug: bool = False) -> None:
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        if self.debug:
            world_size = int(os.environ["WORLD_SIZE"])
            store = torch.distributed.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            torch.distributed.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type.value.startswith("MULTI_"):
            os.environ["LOCAL_RANK"] = str(index)
            nproc, node_rank = int(os.environ.get("NPROC", 1)), int(os.environ.get("NODE_RANK", 0))
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)


# -- the FSDP2 steps of Accelerate's prepare(), callable on their own -------------------------------------------------


def _wrap_kind(policy: Any) -> str | None:
    policy = policy.func if isinstance(policy, functools.partial) else policy
    if policy is transformer_auto_wrap_policy or policy == "transformer_based_wrap":
        return "transformer"
    if policy is size_based_auto_wrap_policy or policy == "size_based_wrap":
        return "size"
    return None


def fsdp2_prepare_auto_wrap_policy(fsdp2_plugin: Any, model: nn.Module) -> Callable[[nn.Module], bool] | None:
    """The plugin's auto-wrap policy as a ``module -> bool`` test for FSDP2 (which submodules get their own
    ``fully_shard``): the transformer classes named in ``transformer_cls_names_to_wrap`` (default: those of the
    model's ``_no_split_modules`` it has), or more than ``min_num_params`` parameters; None for any other policy.
    A named class the model does not have is ``ValueError``."""
    kind = _wrap_kind(fsdp2_plugin.auto_wrap_policy)
    if kind == "size":
        floor = int(fsdp2_plugin.min_num_params or 0)
        return lambda module: sum(p.numel() for p in module.parameters()) > floor
    if kind is None:
        return None
    names = fsdp2_plugin.transformer_cls_names_to_wrap
    if names is None:
        names = [n for n in getattr(model, "_no_split_modules", None) or []
                 if get_module_class_from_name(model, n) is not None]
    classes = []
    for name in names:
        cls = get_module_class_from_name(model, name)
        if cls is None:
            raise ValueError(f"Could not find the transformer layer class {name} in the model.")
        classes.append(cls)

    def policy(module: nn.Module) -> bool:
        # a block wrapped for activation checkpointing is wrapped for sharding by its own class
        return bool(classes) and isinstance(getattr(module, "_checkpoint_wrapped_module", module), tuple(classes))

    return policy


def fsdp2_load_full_state_dict(accelerator: Any, model: nn.Module, full_sd: dict, cpu_offload: bool = False) -> None:
    """Load a full state dict held by the main process (the others may pass ``{}``) into a model sharded with
    FSDP2: every tensor is broadcast from rank 0 and each rank keeps its shard; ``cpu_offload`` leaves the
    shards on the CPU; ``full_sd`` itself is left as it was. A collective: every process calls it."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=accelerator.num_processes > 1,
                               cpu_offload=cpu_offload, strict=True)
    set_model_state_dict(model, dict(full_sd), options=options)  # torch puts the shards in the dict it is given


def fsdp2_prepare_model(accelerator: Any, model: nn.Module) -> nn.Module:
    """``model`` sharded with FSDP2 as the accelerator's plugin says (overdrive's ``prepare_model``, which
    applies the plugin's wrap policy, mixed precision and activation checkpointing in order)."""
    return accelerator.prepare_model(model)


def fsdp2_apply_ac(accelerator: Any, model: nn.Module) -> nn.Module:
    """``model`` with activation checkpointing around each of its blocks (the plugin's
    ``transformer_cls_names_to_wrap``, else the model's repeated blocks), as FSDP2's
    ``activation_checkpointing=True`` applies it; returns the model."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    apply_activation_checkpointing(blocks_to_wrap(model, getattr(plugin, "transformer_cls_names_to_wrap", None)))
    return model


def ensure_weights_retied(param_init_fn: Callable[[nn.Module], Any], model: nn.Module,
                          device: torch.device) -> Callable[[nn.Module], Any]:
    """``param_init_fn`` (a meta-device initialiser run module by module) wrapped so that the parameters the
    model ties (``_tied_weights_keys``) stay one parameter: the first module initialised keeps its new
    parameter and every other module sharing it gets that same one."""
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    tied: dict[int, Any] = {}
    for dotted in tied_names:
        owner, _, attribute = dotted.rpartition(".")
        tied[id(getattr(model.get_submodule(owner), attribute))] = None

    def init_keeping_ties(module: nn.Module) -> Any:
        to_tie: dict[int, list[str]] = {}
        for name, param in module.named_parameters(recurse=False):
            if id(param) in tied:
                to_tie.setdefault(id(param), []).append(name)
        module = param_init_fn(module)
        for key, names in to_tie.items():
            for name in names:
                if tied[key] is None:
                    tied[key] = getattr(module, name)
                else:
                    setattr(module, name, tied[key])
        return module

    return init_keeping_ties


# -- Accelerate's checkpoint folder, written and read file by file ----------------------------------------------------


def _indexed_name(stem: str, suffix: str, index: int) -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def _rng_states(step: int) -> dict[str, Any]:


    states: dict[str, Any] = {"step": step, "random_state": random.getstate(),
                              "numpy_random_seed": np.random.get_state(), "torch_manual_seed": torch.get_rng_state()}
    device_type, device_module = get_torch_accelerator_backend()
    if device_type is not None:
        module = torch.get_device_module(device_type) if device_module is torch.accelerator else device_module
        getter = module.get_rng_state if device_type == "mps" else module.get_rng_state_all
        states[f"torch_{device_type}_manual_seed"] = getter()
    return states


def save_accelerator_state(output_dir: str | os.PathLike, model_states: list[dict], optimizers: list,
                           schedulers: list, dataloaders: list, process_index: int, step: int, scaler: Any = None,
                           save_on_each_node: bool = False, safe_serialization: bool = True) -> Path:
    """Write Accelerate's checkpoint files into ``output_dir``: ``model[_i].safetensors`` (or
    ``pytorch_model[_i].bin``), ``optimizer[_i].bin``, ``scheduler[_i].bin``, the seeded samplers of iterable
    loaders (``sampler[_i].bin``) and stateful loaders' ``dl_state_dict[_i].bin``, ``scaler.pt``, and this
    process's ``random_states_{process_index}.pkl`` (with ``step``); returns the folder."""
    folder = Path(output_dir)
    stem, suffix = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    for i, state in enumerate(model_states):
        save(state, folder / _indexed_name(stem, suffix, i), save_on_each_node=save_on_each_node,
             safe_serialization=safe_serialization)
    for kind, objects in (("optimizer", optimizers), ("scheduler", schedulers)):
        for i, obj in enumerate(objects):
            save(obj.state_dict(), folder / _indexed_name(kind, ".bin", i), save_on_each_node=save_on_each_node)
    for i, loader in enumerate(dataloaders):
        sampler = loader.get_sampler() if isinstance(loader.dataset, IterableDatasetShard) else None
        if isinstance(sampler, SeedableRandomSampler):
            save(sampler, folder / _indexed_name("sampler", ".bin", i), save_on_each_node=save_on_each_node)
        if getattr(loader, "use_stateful_dataloader", False):
            torch.save(loader.state_dict(), folder / _indexed_name("dl_state_dict", ".bin", i))
    if scaler is not None:
        torch.save(scaler.state_dict(), folder / "scaler.pt")
    torch.save(_rng_states(step), folder / f"random_states_{process_index}.pkl")
    logger.info(f"Accelerate checkpoint files saved in {folder}")
    return folder


def load_accelerator_state(input_dir: str | os.PathLike, models: list, optimizers: list, schedulers: list,
                           dataloaders: list, process_index: int, scaler: Any = None, map_location: Any = None,
                           load_kwargs: dict | None = None, **load_model_func_kwargs: Any) -> dict[str, Any]:
    """Read the files ``save_accelerator_state`` wrote (Accelerate's ``save_state`` folder) into the given
    objects and this process's RNG states; returns ``{"step": ...}`` when the RNG file has one. The files are
    unpickled (optimizer, scheduler and RNG states are pickles): load only folders you trust. ``map_location``
    is ``None`` / ``"cpu"`` / ``"on_device"``; ``load_model_func_kwargs`` go to ``load_state_dict`` (``strict``)."""
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(f"map_location={map_location!r} is not valid; choose None, 'cpu' or 'on_device'")
    kwargs = dict(load_kwargs or {})
    if map_location == "on_device":
        kwargs.setdefault("map_location", PartialState().device)
    report = load_accelerate_checkpoint(input_dir, models=models, optimizers=optimizers, schedulers=schedulers,
                                        dataloaders=dataloaders, custom_objects=[], scaler=scaler,
                                        process_index=process_index, allow_pickle=True,
                                        strict=bool(load_model_func_kwargs.get("strict", True)), load_kwargs=kwargs)
    rng_file = Path(input_dir) / f"random_states_{process_index}.pkl"
    return {"step": report.step} if rng_file.is_file() else {}


# -- DeepSpeed launch and optimizer helpers ---------------------------------------------------------------------------


def _deepspeed_multinode_command(args: argparse.Namespace) -> list[str]:
    """DeepSpeed's own multi-machine launcher command line (pdsh, openmpi, ... or ``nossh``)."""
    cmd = ["deepspeed", "--hostfile", str(args.deepspeed_hostfile)]
    if args.deepspeed_multinode_launcher == "nossh":
        cmd += ["--node_rank", str(args.machine_rank), "--no_ssh"]
    else:
        cmd += ["--no_local_rank", "--launcher", str(args.deepspeed_multinode_launcher)]
    if getattr(args, "deepspeed_exclusion_filter", None) is not None:
        cmd += ["--exclude", str(args.deepspeed_exclusion_filter)]
    elif getattr(args, "deepspeed_inclusion_filter", None) is not None:
        cmd += ["--include", str(args.deepspeed_inclusion_filter)]
    else:
        cmd += ["--num_gpus", str(args.num_processes // args.num_machines)]
    if args.main_process_ip:
        cmd += ["--master_addr", str(args.main_process_ip)]
    cmd += ["--master_port", str(args.main_process_port)]
    if getattr(args, "module", False) and getattr(args, "no_python", False):
        raise ValueError("--module and --no_python cannot be used together")
    cmd += ["--module"] if getattr(args, "module", False) else ["--no_python"] if getattr(args, "no_python", False) else []
    return [*cmd, args.training_script, *args.training_script_args]


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str] | None, dict[str, str]]:
    """The command and environment of a DeepSpeed launch from a parsed ``launch`` namespace: on several
    machines with a launcher other than ``standard``, DeepSpeed's own ``deepspeed --hostfile ...`` command line;
    otherwise no command (torchrun starts the workers, its fields filled on ``args``) and the workers'
    environment, as ``prepare_multi_gpu_env`` builds it."""

    if getattr(args, "main_process_port", None) == 0:
        args.main_process_port = get_free_port()
    elif getattr(args, "main_process_port", None) is None:
        args.main_process_port = 29500
    args.deepspeed_multinode_launcher = getattr(args, "deepspeed_multinode_launcher", None) or "pdsh"
    multinode = (getattr(args, "num_machines", 1) or 1) > 1 and args.deepspeed_multinode_launcher != "standard"
    # DeepSpeed's own launcher takes the processes from the command line: torchrun's fields stay off args
    env = prepare_multi_gpu_env(copy.copy(args) if multinode else args)
    env["ACCELERATE_USE_DEEPSPEED"] = "true"
    return (_deepspeed_multinode_command(args) if multinode else None), env


def deepspeed_cpu_optimizer_spec(optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, Any]]:
    """Which of DeepSpeed's CPU optimizers stands for ``optimizer`` and with which arguments: ``Adagrad`` ->
    ``DeepSpeedCPUAdagrad``, anything else -> ``DeepSpeedCPUAdam`` (``adamw_mode`` for AdamW), keeping ``lr``
    and ``weight_decay``."""
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    # bitsandbytes' 32-bit AdamW / Adagrad count as torch's
    bits32 = getattr(optimizer, "optim_bits", None) == 32
    if isinstance(optimizer, torch.optim.Adagrad) or (bits32 and type(optimizer).__name__.startswith("Adagrad")):
        return "deepspeed.ops.adagrad:DeepSpeedCPUAdagrad", defaults
    adamw = isinstance(optimizer, torch.optim.AdamW) or (bits32 and type(optimizer).__name__.startswith("AdamW"))
    return "deepspeed.ops.adam:DeepSpeedCPUAdam", {**defaults, "adamw_mode": adamw}


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """``optimizer`` as the DeepSpeed CPU optimizer of the same kind over the same parameters (for ZeRO's CPU
    offload); builds DeepSpeed's C++ op on first use."""
    target, kwargs = deepspeed_cpu_optimizer_spec(optimizer)
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(optimizer.param_groups, **kwargs)
