"""User-facing configuration: plugins, kwargs handlers, enums and settings, with Accelerate's names and fields.

These are plain values: they never read the environment, never act, and import nothing from the rest of
overdrive (this package is the bottom layer). ``overdrive.resolve`` turns them, the launch config and
the environment into one frozen plan. One file per theme:

- ``enums``: ``DistributedType``, ``PrecisionType``, ``RNGType``, ``LoggerType``, ``DDPCommunicationHookType``
- ``kwargs``: the ``*Kwargs`` handlers and ``GradientAccumulationPlugin``
- ``fp8``: ``AORecipeKwargs``, ``TERecipeKwargs`` (``mixed_precision="fp8"``)
- ``project``: ``ProjectConfiguration``, ``DataLoaderConfiguration``
- ``parallelism`` / ``pipeline``: ``ParallelismConfig``, ``TorchTensorParallelPlugin``, ``PipelineConfig``
- ``fsdp``, ``deepspeed`` (+ ``deepspeed_json``), ``megatron``: the strategy plugins
- ``compile``: ``TorchDynamoPlugin``, ``ActivationCheckpointingKwargs`` (the model path,
  the same under every strategy)
"""

from __future__ import annotations

from overdrive.config.compile import ActivationCheckpointingKwargs, TorchDynamoPlugin
from overdrive.config.deepspeed import DeepSpeedPlugin
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
from overdrive.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin
from overdrive.config.pipeline import PipelineConfig
from overdrive.config.project import DataLoaderConfiguration, ProjectConfiguration

__all__ = [
    "AO_RECIPE_NAMES",
    "FSDP_CONFIG_KEYS",
    "AORecipeKwargs",
    "ActivationCheckpointingKwargs",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DDPCommunicationHookType",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradientAccumulationPlugin",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MegatronLMPlugin",
    "ParallelismConfig",
    "PipelineConfig",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "TorchTensorParallelPlugin",
    "enum_choice",
    "field_names",
]
