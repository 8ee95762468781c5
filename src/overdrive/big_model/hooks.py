"""Hooks that run around a module's forward: Accelerate's ``ModelHook`` protocol on torch's own hook API.

A hook object (``module._hf_hook``, the attribute transformers and PEFT read) has four methods:
``init_hook`` when attached, ``pre_forward`` (may change the inputs), ``post_forward`` (may change the
output) and ``detach_hook`` when removed. ``add_hook_to_module`` registers two torch forward hooks that call
them, so the module's ``forward`` itself is never replaced and ``remove_hook_from_module`` only has to remove
those two handles (unlike Accelerate, a direct ``module.forward(...)`` call bypasses the hook).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch
from torch import nn

from overdrive.big_model.sizes import named_module_tensors, retie_parameters
from overdrive.big_model.tensors import module_and_leaf, set_module_tensor_to_device
from overdrive.helpers.ops import find_device, send_to_device

__all__ = ["ModelHook", "SequentialHook", "AlignDevicesHook", "CpuOffload", "UserCpuOffloadHook",
           "add_hook_to_module", "remove_hook_from_module",
           "has_offloaded_params", "align_module_device"]

_HANDLES = "_overdrive_hook_handles"
_GRAD_MODE = "_overdrive_hook_grad_mode"
#: set on a model's root by dispatch/offload: tied groups to restore when the hooks are removed
TIED_GROUPS = "_overdrive_tied_groups"


class ModelHook:
    """Base class of hooks: override the methods you need. ``no_grad = True`` runs the forward without
    autograd."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module (possibly changed)."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before the forward with its inputs; returns the inputs to use."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward with its output; returns the output to give back."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; undoes ``init_hook``."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (what ``add_hook_to_module(..., append=True)`` builds)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # a plain attribute, which nn.Module.__getattr__'s annotation would call a Tensor | Module
    hook = cast(ModelHook, module._hf_hook)
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        module.__dict__[_GRAD_MODE] = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
    return tuple(args), dict(kwargs)


def _after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    grad_mode = module.__dict__.pop(_GRAD_MODE, None)
    if grad_mode is not None:
        torch.set_grad_enabled(grad_mode)
    hook = module.__dict__.get("_hf_hook")
    return output if hook is None else hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing its hook, or with ``append=True`` running after it).

    Example:
        >>> add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    """
    old = module.__dict__.get("_hf_hook")
    if append and old is not None:
        remove_hook_from_module(module)
        hook = SequentialHook(old, hook)
    module = hook.init_hook(module)
    module.__dict__["_hf_hook"] = hook
    # the forward without the hooks, where Accelerate keeps it: code written for Accelerate calls it to bypass
    # them (the hooks run around forward through nn.Module's own hooks; forward itself is left as it was)
    module.__dict__.setdefault("_old_forward", module.forward)
    if _HANDLES not in module.__dict__:
        # prepend: offloaded weights are in place before other pre-hooks run, and outputs are placed
        # before other forward hooks see them; always_call releases offloaded weights if forward raises
        module.__dict__[_HANDLES] = (
            module.register_forward_pre_hook(_before, with_kwargs=True, prepend=True),
            module.register_forward_hook(_after, with_kwargs=True, prepend=True, always_call=True),
        )
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and with ``recurse=True`` of every submodule), restoring the weights
    the hooks offloaded and, at the root of a dispatched model, its tied parameters."""
    hook = module.__dict__.get("_hf_hook")
    if hook is not None:
        hook.detach_hook(module)
        del module.__dict__["_hf_hook"]
        module.__dict__.pop("_old_forward", None)
    for handle in module.__dict__.pop(_HANDLES, ()):
        handle.remove()
    module.__dict__.pop(_GRAD_MODE, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    tied = module.__dict__.pop(TIED_GROUPS, None)
    if tied:
        retie_parameters(module, tied)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Detach the hooks of every submodule of ``module`` (not of ``module`` itself), recursively."""
    for child in module.children():
        remove_hook_from_module(child, recurse=True)


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: move its inputs there, and with ``offload=True`` bring its
    weights from ``weights_map`` (CPU memory or disk) just before its forward and drop them right after.

    Args:
        execution_device: where the forward runs (weights are moved there when not offloaded).
        offload: keep the weights on the meta device between forwards, loading them from ``weights_map``.
        io_same_device: give the output back on the device the inputs came from.
        weights_map: a mapping from tensor names (relative to the module) to tensors.
        offload_buffers: offload buffers too (else they live on the execution device).
        place_submodules: act on the tensors of every submodule, not only the module's own.
        skip_keys: keyword inputs never moved (a transformers cache, for instance).
        tied_params_map: ``{data_ptr: {device: tensor}}`` so tied weights share one copy per device.
    """

    def __init__(self, execution_device: Any = None, offload: bool = False, io_same_device: bool = False,
                 weights_map: Mapping[str, torch.Tensor] | None = None, offload_buffers: bool = False,
                 place_submodules: bool = False, skip_keys: str | list[str] | None = None,
                 tied_params_map: dict | None = None) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        self.original_devices: dict[str, torch.device] = {}
        self.tied_params_names: set[str] = set()
        self.tied_pointers_to_remove: set[tuple[int, Any]] = set()

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module: nn.Module) -> list[str]:
        return [name for name, _ in named_module_tensors(module, include_buffers=self.offload_buffers,
                                                          recurse=self.place_submodules,
                                                          remove_non_persistent=True)]

    def init_hook(self, module: nn.Module) -> nn.Module:
        if str(self.execution_device) == "meta":
            self.tied_params_map = None  # meta tensors all have data_ptr 0: nothing to share
        tensors = dict(named_module_tensors(module, recurse=self.place_submodules))
        if not self.offload:
            if self.execution_device is not None:
                for name in tensors:
                    set_module_tensor_to_device(module, name, self.execution_device,
                                                tied_params_map=self.tied_params_map)
            return module
        self.original_devices = {name: tensor.device for name, tensor in tensors.items()}
        if self.weights_map is None:
            self.weights_map = {name: tensor.to("cpu") for name, tensor in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=self.place_submodules)}
        for name in self._offloaded(module):
            set_module_tensor_to_device(module, name, "meta")
        if self.execution_device is not None:
            resident = ([n for n, _ in module.named_buffers(recurse=self.place_submodules)]
                        if not self.offload_buffers else
                        [n for n, b in module.named_buffers(recurse=self.place_submodules)
                         if n not in dict(named_module_tensors(module, recurse=self.place_submodules,
                                                               remove_non_persistent=True))])
            for name in resident:
                set_module_tensor_to_device(module, name, self.execution_device,
                                            tied_params_map=self.tied_params_map)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            assert self.weights_map is not None
            for name in self._offloaded(module):
                value = self.weights_map[name]
                if self.tied_params_map is not None and value.device.type != "meta":
                    pointer = value.data_ptr()
                    copies = self.tied_params_map.get(pointer)
                    if copies is not None and self.execution_device not in copies:
                        self.tied_pointers_to_remove.add((pointer, self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            tied_params_map=self.tied_params_map)
        if self.execution_device is None:
            return args, kwargs
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self._offloaded(module):
                set_module_tensor_to_device(module, name, "meta")
            tied = self.tied_params_map
            if tied is not None:  # pointers are only recorded with a map
                for pointer, device in self.tied_pointers_to_remove:
                    tied[pointer].pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            assert self.weights_map is not None
            for name, device in self.original_devices.items():
                if device.type == "meta":
                    continue
                value = self.weights_map[name] if name in self.weights_map else None
                current = getattr(*module_and_leaf(module, name))
                if value is None and current.device.type == "meta":
                    continue  # a non-persistent buffer never left; nothing to restore
                set_module_tensor_to_device(module, name, device, value=value)
        return module


def default_execution_device() -> torch.device:
    """This process's accelerator (its current index) or the CPU when there is none."""
    if not torch.accelerator.is_available():
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    assert accelerator is not None
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU and move it to ``execution_device`` only while it runs; with
    ``prev_module_hook`` (the previous model of a pipeline) that model is sent back to the CPU first."""

    def __init__(self, execution_device: Any = None, prev_module_hook: UserCpuOffloadHook | None = None) -> None:
        if execution_device is None:
            execution_device = default_execution_device()
        self.execution_device = execution_device
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` sends the model back to the CPU, ``remove()``
    takes the hook off."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to the CPU now."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the hook; the model stays where it is."""
        remove_hook_from_module(self.model)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module``'s own weights are offloaded by an :class:`AlignDevicesHook`."""
    hook = module.__dict__.get("_hf_hook")
    return isinstance(hook, AlignDevicesHook) and hook.offload


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Any = None) -> Iterator[None]:
    """Inside the block, ``module``'s weights are real and on ``execution_device`` (default: its hook's),
    even if offloaded; they go back where they were afterwards."""
    if has_offloaded_params(module):
        hook: AlignDevicesHook = module.__dict__["_hf_hook"]
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
        return
    if execution_device is None:
        yield
        return
    devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
    try:
        for name in devices:
            set_module_tensor_to_device(module, name, execution_device)
        yield
    finally:
        for name, device in devices.items():
            set_module_tensor_to_device(module, name, device)
