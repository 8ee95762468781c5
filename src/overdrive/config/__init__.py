"""User-facing configuration: plugins, kwargs handlers, enums and settings, with Accelerate's names and fields.

These are plain values: they never read the environment, never act, and import nothing from the rest of
overdrive but the lazy-export helper (this package is the bottom layer). ``overdrive.resolve`` turns them, the launch config and
the environment into one frozen plan. One file per theme:

- ``enums``: ``DistributedType``, ``PrecisionType``, ``RNGType``, ``LoggerType``, ``DDPCommunicationHookType``
- ``kwargs``: the ``*Kwargs`` handlers and ``GradientAccumulationPlugin``
- ``fp8``: ``AORecipeKwargs``, ``TERecipeKwargs`` (``mixed_precision="fp8"``)
- ``project``: ``ProjectConfiguration``, ``DataLoaderConfiguration``
- ``parallelism`` / ``pipeline``: ``ParallelismConfig``, ``TorchTensorParallelPlugin``, ``PipelineConfig``
- ``fsdp``, ``megatron``: the strategy plugins (DeepSpeed's ``DeepSpeedPlugin`` is beside its strategy, in
  ``overdrive.strategies.deepspeed``, with the rest of DeepSpeed's configuration)
- ``compile``: ``TorchDynamoPlugin``, ``ActivationCheckpointingKwargs`` (the model path,
  the same under every strategy)

Names are imported on first use (``from overdrive.config import ProjectConfiguration`` loads ``project``
alone), so a run that uses no plugin never builds the plugin dataclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "ActivationCheckpointingKwargs": "overdrive.config.compile",
    "TorchDynamoPlugin": "overdrive.config.compile",
    "DDPCommunicationHookType": "overdrive.config.enums",
    "DistributedType": "overdrive.config.enums",
    "LoggerType": "overdrive.config.enums",
    "PrecisionType": "overdrive.config.enums",
    "RNGType": "overdrive.config.enums",
    "enum_choice": "overdrive.config.enums",
    "field_names": "overdrive.config.enums",
    "AO_RECIPE_NAMES": "overdrive.config.fp8",
    "AORecipeKwargs": "overdrive.config.fp8",
    "TERecipeKwargs": "overdrive.config.fp8",
    "FSDP_CONFIG_KEYS": "overdrive.config.fsdp",
    "FullyShardedDataParallelPlugin": "overdrive.config.fsdp",
    "AutocastKwargs": "overdrive.config.kwargs",
    "DistributedDataParallelKwargs": "overdrive.config.kwargs",
    "GradientAccumulationPlugin": "overdrive.config.kwargs",
    "GradScalerKwargs": "overdrive.config.kwargs",
    "InitProcessGroupKwargs": "overdrive.config.kwargs",
    "KwargsHandler": "overdrive.config.kwargs",
    "ProfileKwargs": "overdrive.config.kwargs",
    "MegatronLMPlugin": "overdrive.config.megatron",
    "DeepSpeedSequenceParallelConfig": "overdrive.config.parallelism",
    "ParallelismConfig": "overdrive.config.parallelism",
    "TorchContextParallelConfig": "overdrive.config.parallelism",
    "TorchTensorParallelPlugin": "overdrive.config.parallelism",
    "PipelineConfig": "overdrive.config.pipeline",
    "DataLoaderConfiguration": "overdrive.config.project",
    "ProjectConfiguration": "overdrive.config.project",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.config.compile import ActivationCheckpointingKwargs, TorchDynamoPlugin
    from overdrive.config.enums import (
        DDPCommunicationHookType,
        DistributedType,
        LoggerType,
        PrecisionType,
        RNGType,
        enum_choice,
        field_names,
    )
    from overdrive.config.fp8 import AO_RECIPE_NAMES, AORecipeKwargs, TERecipeKwargs
    from overdrive.config.fsdp import FSDP_CONFIG_KEYS, FullyShardedDataParallelPlugin
    from overdrive.config.kwargs import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradientAccumulationPlugin,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        KwargsHandler,
        ProfileKwargs,
    )
    from overdrive.config.megatron import MegatronLMPlugin
    from overdrive.config.parallelism import (
        DeepSpeedSequenceParallelConfig,
        ParallelismConfig,
        TorchContextParallelConfig,
        TorchTensorParallelPlugin,
    )
    from overdrive.config.pipeline import PipelineConfig
    from overdrive.config.project import DataLoaderConfiguration, ProjectConfiguration
