"""Accelerate's ``accelerate.big_modeling`` names, from :mod:`overdrive.big_model` (re-exports only)."""

from overdrive.big_model.casting import attach_layerwise_casting_hooks
from overdrive.big_model.dispatch import cpu_offload, cpu_offload_with_hook, disk_offload, dispatch_model
from overdrive.big_model.init import init_empty_weights, init_on_device
from overdrive.big_model.loading import load_checkpoint_and_dispatch, load_checkpoint_in_model
from overdrive.big_model.planning import (
    check_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from overdrive.big_model.sizes import find_tied_parameters, get_max_memory, retie_parameters
from overdrive.big_model.tensors import set_module_tensor_to_device
from overdrive.compat.other import _refuse_recurrent_layers_under_sequence_parallelism

__all__ = ["attach_layerwise_casting_hooks", "init_empty_weights", "init_on_device", "cpu_offload", "cpu_offload_with_hook", "disk_offload",
           "dispatch_model", "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "check_device_map",
           "get_balanced_memory", "infer_auto_device_map", "find_tied_parameters", "get_max_memory",
           "retie_parameters", "set_module_tensor_to_device", "_refuse_recurrent_layers_under_sequence_parallelism"]
