"""Accelerate's ``accelerate.utils.modeling`` names, from :mod:`overdrive.big_model` (re-exports only)."""

from overdrive.big_model.checkpoint_files import load_state_dict
from overdrive.big_model.hooks import align_module_device, has_offloaded_params
from overdrive.big_model.loading import load_checkpoint_in_model
from overdrive.big_model.offload import load_offloaded_weights
from overdrive.big_model.planning import (
    check_device_map,
    clean_device_map,
    fallback_allocate,
    get_balanced_memory,
    infer_auto_device_map,
)
from overdrive.big_model.sizes import (
    calculate_maximum_sizes,
    check_device_same,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
    retie_parameters,
)
from overdrive.big_model.state_dicts import get_state_dict_from_offload, get_state_dict_offloaded_model
from overdrive.big_model.tensors import set_module_tensor_to_device
from overdrive.compat.other import get_grad_scaler, get_mixed_precision_context_manager, is_peft_model

__all__ = ["load_state_dict", "load_checkpoint_in_model", "check_device_map", "clean_device_map",
           "get_balanced_memory", "infer_auto_device_map", "check_tied_parameters_on_same_device",
           "compute_module_sizes", "compute_module_total_buffer_size", "convert_file_size_to_int",
           "dtype_byte_size", "find_tied_parameters", "get_max_layer_size", "get_max_memory",
           "get_module_size_with_ties", "get_non_persistent_buffers", "named_module_tensors", "retie_parameters",
           "set_module_tensor_to_device", "align_module_device", "has_offloaded_params", "load_offloaded_weights",
           "calculate_maximum_sizes", "check_tied_parameters_in_config", "id_tensor_storage", "fallback_allocate",
           "check_device_same", "get_module_leaves", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
           "get_grad_scaler", "get_mixed_precision_context_manager", "is_peft_model"]
