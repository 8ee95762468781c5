"""The rest of Accelerate's public surface that scripts and tools import or patch: module loggers, small
helpers and constants of ``accelerate.utils.*``, ``accelerate.data_loader`` and ``accelerate.launchers``,
each implemented over overdrive's own objects (the table in :mod:`overdrive.compat.table` serves them)."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import subprocess
from codecs import encode
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, Literal

import numpy as np
import torch
from packaging.version import parse
from torch import nn

from overdrive.big_model.sizes import find_tied_parameters
from overdrive.helpers.environment import parse_flag_from_env, set_numa_affinity
from overdrive.helpers.logging import get_logger

# -- module loggers: Accelerate's names, the kind Accelerate's module uses (process-aware or plain) -----------
checkpointing_logger = get_logger("accelerate.checkpointing")
data_loader_logger = get_logger("accelerate.data_loader")
fsdp_utils_logger = get_logger("accelerate.utils.fsdp_utils")
other_logger = get_logger("accelerate.utils.other")
big_modeling_logger = logging.getLogger("accelerate.big_modeling")
bnb_logger = logging.getLogger("accelerate.utils.bnb")
modeling_logger = logging.getLogger("accelerate.utils.modeling")
dataclasses_logger = logging.getLogger("accelerate.utils.dataclasses")
environment_logger = logging.getLogger("accelerate.utils.environment")
launch_logger = logging.getLogger("accelerate.commands.launch")
to_fsdp2_logger = logging.getLogger("accelerate.commands.to_fsdp2")

# -- accelerate.utils.dataclasses: the typing aliases of the fp8 and profiler settings --------------------------
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]
AmaxComputeAlgorithm = Literal["max", "most_recent"]
ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]
#: Megatron-LM model type -> its config parser (none registered: overdrive does not run Megatron-LM's loop)
MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Any] = {}


def add_model_config_to_megatron_parser(model_type: str) -> Any:
    """Decorator: register a Megatron-LM model-config parser for ``model_type`` (a transformers model type)
    in ``MODEL_CONFIGS_TO_MEGATRON_PARSERS``; the function itself is returned unchanged in behaviour."""

    def register(parser: Any) -> Any:
        @functools.wraps(parser)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return parser(*args, **kwargs)

        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = wrapper
        return wrapper

    return register

# -- accelerate.utils.imports / versions / other -----------------------------------------------------------------
#: whether torch_xla may be imported (``USE_TORCH_XLA``, default true); overdrive never imports it
USE_TORCH_XLA = parse_flag_from_env("USE_TORCH_XLA", default=True)
#: the installed torch's version
torch_version = parse(version("torch"))
#: numpy's core module (``numpy._core`` from numpy 2)
np_core: Any = np._core if hasattr(np, "_core") else np.core  # pyright: ignore[reportAttributeAccessIssue]
#: what ``torch.load(weights_only=True)`` must accept in Accelerate's checkpoints (numpy arrays, RNG states)
TORCH_SAFE_GLOBALS: list[Any] = [np_core.multiarray._reconstruct, np.ndarray, encode, np.dtype,
                                 *([np.dtypes.UInt32DType] if hasattr(np, "dtypes") else [])]

# -- accelerate.utils.environment --------------------------------------------------------------------------------


@dataclass
class CPUInformation:
    """A CPU process's place: rank, world size, local rank and local world size."""

    rank: int = field(default=0, metadata={"help": "The rank of the current process."})
    world_size: int = field(default=1, metadata={"help": "The total number of processes in the world."})
    local_rank: int = field(default=0, metadata={"help": "The rank of the current process on the local node."})
    local_world_size: int = field(default=1, metadata={"help": "The total number of processes on the local node."})


def get_driver_version() -> str:
    """The NVIDIA driver's version (of the first GPU), from ``nvidia-smi``; ``FileNotFoundError`` without it."""
    smi = shutil.which("nvidia-smi") or shutil.which("nvidia-smi.exe")
    if smi is None:
        raise FileNotFoundError("nvidia-smi was not found on PATH: the NVIDIA driver's version cannot be read")
    output = subprocess.check_output([smi, "--query-gpu=driver_version", "--format=csv,noheader"], text=True)
    return output.strip().split(os.linesep)[0]


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """As ``set_numa_affinity``: overdrive leaves NUMA binding to torchrun (``--numa-binding``)."""
    set_numa_affinity(local_process_index, verbose)


# -- accelerate.utils.launch: the environment Accelerate's launcher hands its workers ------------------------------


def env_var_path_add(env_var_name: str, path_to_add: Any) -> str:
    """The value of the path list ``env_var_name`` (``a:b``) with ``path_to_add`` appended (not set)."""
    paths = [p for p in os.environ.get(env_var_name, "").split(":") if p]
    return ":".join([*paths, str(path_to_add)])


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """``current_env`` with the ``--fp8_*`` launch flags as ``ACCELERATE_FP8_*`` variables."""
    for name, value in vars(args).items():
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            for part, item in zip(("FPROP", "DGRAD", "WGRAD"), value, strict=False):
                current_env[f"ACCELERATE_FP8_OVERRIDE_{part}"] = str(item)
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = str(value)
    return current_env


def prepare_extend_env_parallelism_config(args: argparse.Namespace, current_env: dict) -> dict:
    """``current_env`` with the ``--parallelism_config_*`` launch flags as ``PARALLELISM_CONFIG_*`` variables
    (what ``ParallelismConfig()`` reads)."""
    prefix = "PARALLELISM_CONFIG_"
    current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    for key in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend"):
        current_env[prefix + key.upper()] = str(getattr(args, f"parallelism_config_{key}"))
    if args.parallelism_config_cp_size > 1:
        current_env[prefix + "CP_COMM_STRATEGY"] = str(args.parallelism_config_cp_comm_strategy)
    if args.parallelism_config_sp_size > 1:
        for key in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
            current_env[prefix + key.upper()] = str(getattr(args, f"parallelism_config_{key}"))
    return current_env


# -- accelerate.utils.bnb: the helpers that only read a model ------------------------------------------------------


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of a module's first parameter."""
    return next(parameter.parameters()).device


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """The module names to keep in full precision when quantising ``model``: its tied weights and its last
    child (the head); none for a base model (``base_model_prefix`` not an attribute) without tied weights."""
    tied_keys = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = isinstance(prefix, str) and not hasattr(model, prefix)
    if not tied_keys and is_base_model:
        return []
    last = list(model.named_children())[-1][0]
    untouched = list(set(tied_keys)) + list({last} - set(tied_keys))
    return [name.replace(".weight", "").replace(".bias", "") for name in untouched]


# -- accelerate.data_loader -----------------------------------------------------------------------------------------


class DataLoaderAdapter:
    """A data loader built from ``dataset`` and DataLoader arguments (torchdata's ``StatefulDataLoader`` with
    ``use_stateful_dataloader=True``) that answers every attribute from it, and whose ``state_dict()`` is the
    loader's state when built (or as last updated)."""

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None,
                 **kwargs: Any) -> None:
        self.use_stateful_dataloader = use_stateful_dataloader
        self.base_dataloader: Any
        if use_stateful_dataloader:
            from torchdata.stateful_dataloader import StatefulDataLoader  # lazy: optional dependency

            self.base_dataloader = StatefulDataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        else:
            self.base_dataloader = torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":  # not built yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __iter__(self) -> Any:
        return iter(self.base_dataloader)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def state_dict(self) -> Any:
        """The loader's state, as last recorded."""
        return self.dl_state_dict

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore the loader's position (a stateful loader)."""
        self.base_dataloader.load_state_dict(state_dict)

    def _update_state_dict(self) -> None:
        if hasattr(self.base_dataloader, "state_dict"):
            self.dl_state_dict = self.base_dataloader.state_dict()
