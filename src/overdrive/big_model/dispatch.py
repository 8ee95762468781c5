"""Running a model that does not fit in one place: ``dispatch_model`` (per a device map), ``cpu_offload``,
``disk_offload`` and ``cpu_offload_with_hook`` (whole models taking turns on the accelerator).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from overdrive.big_model import device_map_check_sources
from overdrive.big_model.attach import attach_align_device_hook, attach_align_device_hook_on_blocks
from overdrive.big_model.hooks import (
    TIED_GROUPS,
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from overdrive.big_model.offload import (
    INDEX_FILE,
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    offload_state_dict,
)
from overdrive.big_model.planning import check_device_map
from overdrive.big_model.sizes import find_tied_parameters, retie_parameters
from overdrive.big_model.tensors import resolve_device

logger = logging.getLogger(__name__)

__all__ = ["dispatch_model", "cpu_offload", "cpu_offload_with_hook", "disk_offload"]

_OFFLOAD = ("cpu", "disk")


def _first_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def tied_weights(model: nn.Module, retie: bool = False) -> Iterator[dict[int, dict]]:
    """The one discovery of ``model``'s tied weights around attaching hooks to it. Yields the map that lets
    tied weights share one copy per device (``{data_ptr: {}}`` for each tied parameter holding data, the
    hooks' ``tied_params_map``). Afterwards, with ``retie``, every name of a group points at one parameter
    again (moving parameters replaced some objects), and the groups are recorded on the model, so that
    ``remove_hook_from_module`` re-ties them (recorded last: attaching a hook detaches the previous one,
    which takes the record)."""
    groups = find_tied_parameters(model)
    shared: dict[int, dict] = {}
    for group in groups:
        for name in group:
            tensor = model.get_parameter(name)
            if tensor.device.type != "meta":
                shared[tensor.data_ptr()] = {}
    yield shared
    if retie:
        retie_parameters(model, groups)
    if groups:
        model.__dict__[TIED_GROUPS] = groups


def _has_index(folder: str | os.PathLike[str] | None) -> bool:
    return folder is not None and os.path.isfile(os.path.join(os.fspath(folder), INDEX_FILE))


def _device_map_check() -> Callable[[nn.Module, Mapping[str, Any]], None]:
    """``check_device_map``, or what replaced it in a namespace of ``device_map_check_sources`` (the
    ``accelerate.big_modeling`` compat module: transformers assigns a no-op there)."""
    for source in reversed(device_map_check_sources):
        replaced = getattr(source, "check_device_map", None)
        if replaced is not None:
            return replaced
    return check_device_map


def cpu_offload(model: nn.Module, execution_device: Any = None, offload_buffers: bool = False,
                state_dict: Mapping[str, torch.Tensor] | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep ``model``'s weights in CPU memory and bring each module's weights to ``execution_device`` only
    for its forward (one layer's worth of accelerator memory at a time).

    Example:
        >>> model = cpu_offload(model, execution_device=0)
    """
    execution_device = _first_device(model) if execution_device is None else execution_device
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    return _offload_hooks(model, execution_device, offload_buffers, state_dict, preload_module_classes)


def disk_offload(model: nn.Module, offload_dir: str | os.PathLike[str], execution_device: Any = None,
                 offload_buffers: bool = False, preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write ``model``'s weights to ``offload_dir`` (unless it already holds an offload index) and read
    each module's weights from there only for its forward.

    Example:
        >>> model = disk_offload(model, "offload", execution_device="cpu")
    """
    if not _has_index(offload_dir):
        offload_state_dict(offload_dir, model.state_dict())
    execution_device = _first_device(model) if execution_device is None else execution_device
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    return _offload_hooks(model, execution_device, offload_buffers, weights_map, preload_module_classes)


def _offload_hooks(model: nn.Module, execution_device: Any, offload_buffers: bool, weights_map: Any,
                   preload_module_classes: list[str] | None) -> nn.Module:
    """Hook ``model`` so that each module's weights come from ``weights_map`` to ``execution_device`` for its
    forward only, and its outputs go back to where its inputs were."""
    with tied_weights(model):
        add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
        attach_align_device_hook(model, execution_device=execution_device, offload=True,
                                 offload_buffers=offload_buffers, weights_map=weights_map,
                                 preload_module_classes=preload_module_classes)
    return model


def cpu_offload_with_hook(model: nn.Module, execution_device: Any = None,
                          prev_module_hook: UserCpuOffloadHook | None = None
                          ) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep the whole ``model`` on the CPU and move it to ``execution_device`` when it runs; it stays there
    until the returned hook's ``offload()`` is called, or until the next model of a chain (given this
    hook as ``prev_module_hook``) starts.

    Example:
        >>> encoder, hook1 = cpu_offload_with_hook(encoder, 0)
        >>> decoder, hook2 = cpu_offload_with_hook(decoder, 0, prev_module_hook=hook1)
        >>> out = decoder(encoder(x)); hook2.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def _main_device(device_map: Mapping[str, Any], main_device: Any) -> Any:
    if main_device is not None:
        return main_device
    placed = [d for d in device_map.values() if d not in _OFFLOAD]
    return placed[0] if placed else "cpu"


def _check_disk(device_map: Mapping[str, Any], offload_dir: Any, offload_index: Any) -> list[str]:
    disk = [name for name, device in device_map.items() if device == "disk"]
    if disk and offload_dir is None and offload_index is None:
        raise ValueError(f"the device_map puts {disk} on 'disk' but no offload folder was given; pass "
                         "offload_dir= (dispatch_model) or offload_folder= (loading) naming a folder to write "
                         "them to")
    return disk


def dispatch_model(model: nn.Module, device_map: Mapping[str, Any], main_device: Any = None,
                   state_dict: Mapping[str, torch.Tensor] | None = None,
                   offload_dir: str | os.PathLike[str] | None = None, offload_index: Mapping[str, Any] | None = None,
                   offload_buffers: bool = False, skip_keys: str | list[str] | None = None,
                   preload_module_classes: list[str] | None = None, force_hooks: bool = False) -> nn.Module:
    """Place ``model`` per ``device_map`` and hook it so a forward runs across those devices.

    Modules mapped to an accelerator live there; modules mapped to ``"cpu"`` or ``"disk"`` are run on
    ``main_device`` (the first accelerator of the map, or the CPU) with their weights brought in for their
    forward. ``"disk"`` weights come from ``offload_dir`` (written there now if it holds no index yet) or
    from ``offload_index`` entries. The map is checked first: an unknown name, a tensor without a device or
    a missing offload folder raise before anything moves. Sets ``model.hf_device_map``.

    Example:
        >>> dispatch_model(model, {"embed": 0, "layers.0": 0, "layers.1": "cpu", "head": "disk"},
        ...                offload_dir="offload")
    """
    _device_map_check()(model, device_map)
    disk = _check_disk(device_map, offload_dir, offload_index)
    devices = set(device_map.values())
    if len(devices) > 1 or "disk" in devices or force_hooks:  # a model all on disk runs from it (as Accelerate)
        _hook_model(model, device_map, _main_device(device_map, main_device), state_dict, offload_dir,
                    offload_index, offload_buffers, skip_keys, preload_module_classes, disk)
    else:
        (device,) = devices
        model.to(resolve_device(device))
    setattr(model, "hf_device_map", dict(device_map))  # noqa: B010 - a plain attribute, as transformers reads it
    return model


def _hook_model(model: nn.Module, device_map: Mapping[str, Any], main: Any, state_dict: Any, offload_dir: Any,
                offload_index: Any, offload_buffers: bool, skip_keys: Any, preload: Any, disk: list[str]) -> None:
    main_is_cpu = str(main) in ("cpu", "mps")
    cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
    if not main_is_cpu and state_dict is None and cpu_modules:
        state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
    if disk and offload_index is None and not _has_index(offload_dir):
        offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk))
    execution = {name: main if device in _OFFLOAD else device for name, device in device_map.items()}
    execution[""] = main
    offloaded = ("disk",) if main_is_cpu else _OFFLOAD
    offload = {name: device in offloaded for name, device in device_map.items()}
    folder = offload_dir if disk else None
    weights_map = None
    if state_dict is not None or folder is not None or offload_index is not None:
        weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=folder, index=offload_index,
                                             device=main if offload_index is not None else None)
    with tied_weights(model, retie=True) as tied_params_map:
        attach_align_device_hook_on_blocks(model, execution_device=execution, offload=offload,
                                           offload_buffers=offload_buffers, weights_map=weights_map,
                                           skip_keys=skip_keys, preload_module_classes=preload,
                                           tied_params_map=tied_params_map)
    placed = sorted({str(d) for d in device_map.values() if d in _OFFLOAD})
    if placed:
        logger.info("Some parameters are on the meta device because they were offloaded to %s.",
                    " and ".join(placed))
