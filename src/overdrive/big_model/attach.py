"""Attaching :class:`~overdrive.big_model.hooks.AlignDevicesHook` over a whole model, following a device map.

Three walks, as Accelerate has them (transformers and diffusers call them by name):

- ``attach_align_device_hook``: one hook on every module that holds tensors itself (offloaded or not);
- ``attach_execution_device_hook``: a plain "run here" hook on every module with state and no hook yet;
- ``attach_align_device_hook_on_blocks``: per device-map entry, either of the above.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from overdrive.big_model.hooks import AlignDevicesHook, add_hook_to_module
from overdrive.big_model.offload import PrefixedDataset
from overdrive.big_model.sizes import named_module_tensors

__all__ = ["attach_align_device_hook", "attach_execution_device_hook", "attach_align_device_hook_on_blocks"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def attach_execution_device_hook(module: nn.Module, execution_device: Any, skip_keys: Any = None,
                                 preload_module_classes: list[str] | None = None,
                                 tied_params_map: dict | None = None) -> None:
    """Give every module with state (and no hook yet) a hook that moves its inputs to ``execution_device``."""
    if "_hf_hook" not in module.__dict__ and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return  # a preloaded module's hook already covers its children
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: Any = None, offload: bool = False,
                             weights_map: Mapping | None = None, offload_buffers: bool = False,
                             module_name: str = "", skip_keys: Any = None,
                             preload_module_classes: list[str] | None = None,
                             tied_params_map: dict | None = None) -> None:
    """Hook every module holding tensors directly; a module of a ``preload_module_classes`` class loads all
    its submodules' weights at once (for modules that use their children's weights outside forward)."""
    has_tensors = next(iter(named_module_tensors(module)), None) is not None
    full = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if has_tensors or full:
        prefixed = None if weights_map is None else PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        hook = AlignDevicesHook(execution_device=execution_device, offload=offload, weights_map=prefixed,
                                offload_buffers=offload_buffers, place_submodules=full, skip_keys=skip_keys,
                                tied_params_map=tied_params_map)
        add_hook_to_module(module, hook, append=True)
    if full:
        return
    for name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload,
                                 weights_map=weights_map, offload_buffers=offload_buffers,
                                 module_name=_join(module_name, name), skip_keys=skip_keys,
                                 preload_module_classes=preload_module_classes, tied_params_map=tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module, execution_device: Any = None,
                                       offload: bool | Mapping[str, bool] = False,
                                       weights_map: Mapping | None = None, offload_buffers: bool = False,
                                       module_name: str = "", skip_keys: Any = None,
                                       preload_module_classes: list[str] | None = None,
                                       tied_params_map: dict | None = None) -> None:
    """Hook a model block by block: ``execution_device`` and ``offload`` are per-block mappings (from a
    device map) or one value for the whole model."""
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device=execution_device, offload=True,
                                     weights_map=weights_map, offload_buffers=offload_buffers,
                                     module_name=module_name, skip_keys=skip_keys, tied_params_map=tied_params_map)
        else:
            add_hook_to_module(module, AlignDevicesHook(execution_device=execution_device, io_same_device=True,
                                                        skip_keys=skip_keys, place_submodules=True,
                                                        tied_params_map=tied_params_map))
        return
    if isinstance(execution_device, Mapping):
        devices: Mapping[str, Any] = execution_device
    else:  # then offload is the mapping (one of the two is, past the first branch)
        assert isinstance(offload, Mapping)
        devices = dict.fromkeys(offload, execution_device)
    offloads = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    common = {"skip_keys": skip_keys, "tied_params_map": tied_params_map}
    if module_name in devices and module_name in offloads and not offloads[module_name]:
        add_hook_to_module(module, AlignDevicesHook(execution_device=devices[module_name],
                                                    offload_buffers=offload_buffers,
                                                    io_same_device=module_name == "", place_submodules=True,
                                                    **common))
        attach_execution_device_hook(module, devices[module_name], **common)
    elif module_name in devices and module_name in offloads:
        attach_align_device_hook(module, execution_device=devices[module_name], offload=True,
                                 weights_map=weights_map, offload_buffers=offload_buffers, module_name=module_name,
                                 preload_module_classes=preload_module_classes, **common)
        if "_hf_hook" not in module.__dict__:
            add_hook_to_module(module, AlignDevicesHook(execution_device=devices[module_name],
                                                        io_same_device=module_name == "", **common))
        attach_execution_device_hook(module, devices[module_name], preload_module_classes=preload_module_classes,
                                     **common)
    elif module_name == "":
        add_hook_to_module(module, AlignDevicesHook(execution_device=devices.get(""), io_same_device=True,
                                                    **common))
    for name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device=devices, offload=offloads,
                                           weights_map=weights_map, offload_buffers=offload_buffers,
                                           module_name=_join(module_name, name),
                                           preload_module_classes=preload_module_classes, **common)
