"""overdrive: one plain PyTorch training loop on a CPU, one GPU, many GPUs and many machines.

    from overdrive import Accelerator
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

Public names are imported on first use, so ``import overdrive`` costs next to nothing over ``import torch``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports
from overdrive._version import __version__
from overdrive.compat.paths import install_served_paths

# Accelerate's dotted paths (overdrive.utils, overdrive.hooks, ...) come from the compat table, not from files
install_served_paths()

# public name -> module that defines it
_EXPORTS = {
    "Accelerator": "overdrive.accelerator",
    "PartialState": "overdrive.training.state",
    "AcceleratorState": "overdrive.training.state",
    "GradientState": "overdrive.training.state",
    "DistributedType": "overdrive.config",
    "DataLoaderConfiguration": "overdrive.config",
    "GradientAccumulationPlugin": "overdrive.config",
    "ProjectConfiguration": "overdrive.config",
    "DistributedDataParallelKwargs": "overdrive.config",
    "GradScalerKwargs": "overdrive.config",
    "InitProcessGroupKwargs": "overdrive.config",
    "AutocastKwargs": "overdrive.config",
    "ProfileKwargs": "overdrive.config",
    "AORecipeKwargs": "overdrive.config",
    "TERecipeKwargs": "overdrive.config",
    "DDPCommunicationHookType": "overdrive.config",
    "FullyShardedDataParallelPlugin": "overdrive.config",
    "DeepSpeedPlugin": "overdrive.strategies.deepspeed",
    "MegatronLMPlugin": "overdrive.config",
    "ParallelismConfig": "overdrive.config",
    "PipelineConfig": "overdrive.config",
    "TorchTensorParallelPlugin": "overdrive.config",
    "TorchDynamoPlugin": "overdrive.config",
    "ActivationCheckpointingKwargs": "overdrive.config",
    "LocalSGD": "overdrive.accelerator.local_sgd",
    "skip_first_batches": "overdrive.data",
    "prepare_data_loader": "overdrive.data",
    "find_executable_batch_size": "overdrive.helpers.memory",
    "release_memory": "overdrive.helpers.memory",
    "set_seed": "overdrive.helpers.random",
    "synchronize_rng_states": "overdrive.helpers.random",
    "get_logger": "overdrive.helpers.logging",
    "notebook_launcher": "overdrive.launchers.notebook",
    "debug_launcher": "overdrive.launchers.notebook",
    # big-model inference (Accelerate's top-level names)
    "init_empty_weights": "overdrive.big_model.init",
    "init_on_device": "overdrive.big_model.init",
    "cpu_offload": "overdrive.big_model.dispatch",
    "cpu_offload_with_hook": "overdrive.big_model.dispatch",
    "disk_offload": "overdrive.big_model.dispatch",
    "dispatch_model": "overdrive.big_model.dispatch",
    "load_checkpoint_and_dispatch": "overdrive.big_model.loading",
    "load_checkpoint_in_model": "overdrive.big_model.loading",
    "infer_auto_device_map": "overdrive.big_model.planning",
    "install_as_accelerate": "overdrive.compat.alias",
    "uninstall_as_accelerate": "overdrive.compat.alias",
    "prepare_pippy": "overdrive.big_model.pippy",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def _compat_names() -> dict[str, str]:
    """Accelerate's other top-level names (``overdrive.compat.table``), loaded only when asked for."""
    # lazy: import overdrive loads no table until a name is asked for
    from overdrive.compat.table import NAMES

    return NAMES["overdrive"]


__getattr__, _dir = lazy_exports(__name__, _EXPORTS, _compat_names)


def __dir__() -> list[str]:
    """The public names only (the lazy ones included)."""
    return __all__


# A worker of ``overdrive launch --as_accelerate`` (launchers.protocol.AS_ACCELERATE_VAR): the alias is in place
# before the worker entry point, a module of this package, runs the script. A process below it that imported the
# real Accelerate first keeps it (the alias would refuse to mix the two).
if os.environ.get("OVERDRIVE_AS_ACCELERATE") == "1" and "accelerate" not in sys.modules:
    from overdrive.compat.alias import install_as_accelerate

    install_as_accelerate()


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from overdrive.accelerator import Accelerator
    from overdrive.accelerator.local_sgd import LocalSGD
    from overdrive.big_model.dispatch import cpu_offload, cpu_offload_with_hook, disk_offload, dispatch_model
    from overdrive.big_model.init import init_empty_weights, init_on_device
    from overdrive.big_model.loading import load_checkpoint_and_dispatch, load_checkpoint_in_model
    from overdrive.big_model.pippy import prepare_pippy
    from overdrive.big_model.planning import infer_auto_device_map
    from overdrive.compat.alias import install_as_accelerate, uninstall_as_accelerate
    from overdrive.config import (
        ActivationCheckpointingKwargs,
        AORecipeKwargs,
        AutocastKwargs,
        DataLoaderConfiguration,
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        DistributedType,
        FullyShardedDataParallelPlugin,
        GradientAccumulationPlugin,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        MegatronLMPlugin,
        ParallelismConfig,
        PipelineConfig,
        ProfileKwargs,
        ProjectConfiguration,
        TERecipeKwargs,
        TorchDynamoPlugin,
        TorchTensorParallelPlugin,
    )
    from overdrive.data import prepare_data_loader, skip_first_batches
    from overdrive.helpers.logging import get_logger
    from overdrive.helpers.memory import find_executable_batch_size, release_memory
    from overdrive.helpers.random import set_seed, synchronize_rng_states
    from overdrive.launchers.notebook import debug_launcher, notebook_launcher
    from overdrive.strategies.deepspeed import DeepSpeedPlugin
    from overdrive.training.state import AcceleratorState, GradientState, PartialState
