"""The names users import from ``accelerate.utils``, under ``overdrive.utils``.

Imported on first use, so that ``from overdrive.utils import set_seed`` loads only what it needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_CONFIG = ("DistributedType", "PrecisionType", "RNGType", "LoggerType", "DDPCommunicationHookType",
           "KwargsHandler", "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs",
           "AutocastKwargs", "ProfileKwargs", "DataLoaderConfiguration", "GradientAccumulationPlugin",
           "ProjectConfiguration", "FullyShardedDataParallelPlugin", "ParallelismConfig", "TorchTensorParallelPlugin",
           "DeepSpeedPlugin", "MegatronLMPlugin")
_OPS = ("gather", "gather_object", "broadcast", "broadcast_object_list", "reduce", "pad_across_processes",
        "send_to_device", "recursively_apply", "concatenate", "convert_to_fp32", "find_batch_size",
        "find_device", "listify", "slice_tensors", "honor_type", "is_torch_tensor")
_MISC = ("is_package_available", "is_tensorboard_available", "is_wandb_available", "is_mlflow_available",
         "is_aim_available", "is_deepspeed_available", "is_transformers_available", "is_torchao_available",
         "is_rich_available", "is_datasets_available", "is_megatron_lm_available", "wait_for_everyone",
         "extract_model_from_parallel", "patch_environment", "tqdm")

# big-model names (accelerate.utils re-exports them from utils.modeling and utils.offload)
_MODELING = ("align_module_device", "calculate_maximum_sizes", "check_device_map", "check_tied_parameters_in_config",
             "check_tied_parameters_on_same_device", "clean_device_map", "compute_module_sizes",
             "compute_module_total_buffer_size", "convert_file_size_to_int", "dtype_byte_size",
             "find_tied_parameters", "get_balanced_memory", "get_max_layer_size", "get_max_memory",
             "get_module_size_with_ties", "get_non_persistent_buffers", "has_offloaded_params", "id_tensor_storage",
             "infer_auto_device_map", "load_checkpoint_in_model", "load_offloaded_weights", "load_state_dict",
             "named_module_tensors", "retie_parameters", "set_module_tensor_to_device")
_OFFLOAD = ("OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
            "offload_state_dict", "offload_weight", "save_offload_index")

_EXPORTS: dict[str, str] = {
    **{name: "overdrive.utils.modeling" for name in _MODELING},
    **{name: "overdrive.utils.offload" for name in _OFFLOAD},
    **{name: "overdrive.config" for name in _CONFIG},
    **{name: "overdrive.ops" for name in _OPS},
    **{name: "overdrive.utils.misc" for name in _MISC},
    "set_seed": "overdrive.utils.random",
    "synchronize_rng_state": "overdrive.utils.random",
    "synchronize_rng_states": "overdrive.utils.random",
    "find_executable_batch_size": "overdrive.utils.memory",
    "release_memory": "overdrive.utils.memory",
    "clear_device_cache": "overdrive.utils.memory",
    "skip_first_batches": "overdrive.data",
    "DummyOptim": "overdrive.deepspeed.objects",
    "DummyScheduler": "overdrive.deepspeed.objects",
    "get_active_deepspeed_plugin": "overdrive.deepspeed.objects",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'overdrive.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
