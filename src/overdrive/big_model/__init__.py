"""Big-model inference: build a model without memory, plan where its parts go, and run it across
accelerators, CPU memory and disk.

    from overdrive.big_model import init_empty_weights, load_checkpoint_and_dispatch
    with init_empty_weights():
        model = MyModel(config)
    model = load_checkpoint_and_dispatch(model, "checkpoint/", device_map="auto", offload_folder="offload")

Modules: ``init`` (meta init), ``sizes`` and ``planning`` (sizes, memory, device maps), ``tensors`` (moving
one tensor), ``hooks`` and ``attach`` (forward hooks), ``offload`` (the offload folder format),
``dispatch`` (dispatch / CPU and disk offload), ``checkpoint_files`` and ``loading`` (streaming loads),
``safetensors_io`` and ``mapped_files`` (zero-copy weights in a file mapping, guarded against truncation),
``estimate`` (memory estimates for ``overdrive estimate-memory``), ``pippy`` (pipelined inference).
Names are imported on first use.
"""

from __future__ import annotations

from typing import Any

from overdrive._lazy import lazy_exports

#: namespaces whose own ``check_device_map`` replaces the one ``dispatch_model`` calls: compat adds the module it
#: serves at Accelerate's ``big_modeling`` path, where transformers assigns a no-op to dispatch models whose
#: ``_no_placement_params`` stay unmapped (this layer cannot name that module: it lives above)
device_map_check_sources: list[Any] = []

_MODULES = {
    "init": ("init_empty_weights", "init_on_device"),
    "sizes": ("convert_file_size_to_int", "dtype_byte_size", "named_module_tensors", "get_non_persistent_buffers",
              "compute_module_sizes", "compute_module_total_buffer_size", "get_max_layer_size",
              "find_tied_parameters", "retie_parameters", "get_module_size_with_ties",
              "check_tied_parameters_on_same_device", "get_max_memory", "id_tensor_storage",
              "check_tied_parameters_in_config", "calculate_maximum_sizes", "check_device_same", "get_module_leaves"),
    "planning": ("get_balanced_memory", "infer_auto_device_map", "check_device_map", "clean_device_map",
                 "fallback_allocate"),
    "casting": ("LayerwiseCastingHook", "attach_layerwise_casting_hooks"),
    "state_dicts": ("get_state_dict_offloaded_model", "get_state_dict_from_offload"),
    "tensors": ("set_module_tensor_to_device",),
    "hooks": ("ModelHook", "SequentialHook", "AlignDevicesHook", "CpuOffload", "UserCpuOffloadHook",
              "add_hook_to_module", "remove_hook_from_module", "has_offloaded_params", "align_module_device"),
    "attach": ("attach_align_device_hook", "attach_execution_device_hook", "attach_align_device_hook_on_blocks"),
    "offload": ("offload_weight", "load_offloaded_weight", "save_offload_index", "offload_state_dict",
                "load_offloaded_weights", "PrefixedDataset", "OffloadedWeightsLoader",
                "extract_submodules_state_dict"),
    "dispatch": ("dispatch_model", "cpu_offload", "cpu_offload_with_hook", "disk_offload"),
    "checkpoint_files": ("load_state_dict", "CheckpointError"),
    "mapped_files": ("MappedFileError",),
    "loading": ("load_checkpoint_in_model", "load_checkpoint_and_dispatch"),
    "pippy": ("prepare_pippy", "find_pippy_batch_size", "generate_device_map"),
}

#: public name -> the module of this package that defines it
EXPORTS = {name: f"overdrive.big_model.{module}" for module, names in _MODULES.items() for name in names}

__all__ = sorted(EXPORTS)


__getattr__, _dir = lazy_exports(__name__, EXPORTS)


def __dir__() -> list[str]:
    """The public names only."""
    return __all__
