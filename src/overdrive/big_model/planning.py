"""Device maps: which device (accelerator index, ``"cpu"`` or ``"disk"``) holds each part of a model.

``infer_auto_device_map`` fills accelerators in order, then the CPU, then the disk, walking the model's
modules in definition order and splitting a module into its children only when it does not fit (never a
module whose class is in ``no_split_module_classes``). Tied parameters go on one device together. On each
"main" device (the first accelerator and the CPU) room for the largest layer is kept free, because an
offloaded layer is brought there to run. The planner works from shapes only: devices need not exist.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from overdrive.big_model.sizes import (
    DeviceKey,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_size_with_ties,
)

logger = logging.getLogger(__name__)

__all__ = ["get_balanced_memory", "infer_auto_device_map", "check_device_map", "clean_device_map",
           "fallback_allocate"]


def _class_names(no_split_module_classes: Any) -> list[str]:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def get_balanced_memory(model: nn.Module, max_memory: dict[DeviceKey, int | str] | None = None,
                        no_split_module_classes: list[str] | None = None, dtype: torch.dtype | str | None = None,
                        special_dtypes: Mapping[str, torch.dtype | str] | None = None,
                        low_zero: bool = False) -> dict[DeviceKey, int]:
    """A ``max_memory`` that spreads the model evenly over the accelerators (for ``device_map="balanced"``).

    Every accelerator but the last is capped at the model size divided by the number of accelerators plus
    a margin (the largest no-split block or the mean leaf module, times 1.25). ``low_zero`` keeps
    accelerator 0 as empty as possible (for ``generate``, which keeps its buffers there).
    """
    user_gave_memory = max_memory is not None
    memory = get_max_memory(max_memory)
    accelerators = sorted(k for k, v in memory.items() if isinstance(k, int) and v > 0)
    if not accelerators:
        return memory
    if len(accelerators) == 1:
        low_zero = False
        if not user_gave_memory:  # leave a tenth free for activations when we picked the numbers ourselves
            memory[accelerators[0]] = int(memory[accelerators[0]] * 0.9)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_device = sizes[""] // (len(accelerators) - 1 if low_zero else len(accelerators))
    classes = _class_names(no_split_module_classes)
    block = 0
    if classes:
        blocks = [sizes.get(name, 0) for name, module in model.named_modules() if type(module).__name__ in classes]
        block = max(blocks, default=0)
    tensor_names = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    module_sizes = {name: size for name, size in sizes.items() if name not in tensor_names}
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name} | {""}
    leaves = [name for name in module_sizes if name not in parents]
    mean_leaf = int(sum(module_sizes[name] for name in leaves) / max(len(leaves), 1))
    per_device += int(1.25 * max(block, mean_leaf))
    for index in accelerators[:-1]:  # the last accelerator keeps all it has, in case the margin is short
        cap = memory[0] if low_zero and index == 0 else per_device
        memory[index] = min(cap, memory[index])
    if low_zero:
        others = sum(memory[i] for i in accelerators[1:])
        memory[0] = min(max(0, sizes[""] - others), memory[0])
    return memory


class _Planner:
    """The state of one ``infer_auto_device_map`` run: devices, what each holds, what is left to place."""

    def __init__(self, model: nn.Module, memory: dict[DeviceKey, int], classes: list[str], dtype: Any,
                 special_dtypes: Any, offload_buffers: bool, verbose: bool, fallback: bool = False) -> None:
        self.model, self.classes, self.verbose, self.fallback = model, classes, verbose, fallback
        self.dtype, self.special_dtypes, self.offload_buffers = dtype, special_dtypes, offload_buffers
        self.memory = memory
        self.devices: list[DeviceKey] = list(memory) + ([] if "disk" in memory else ["disk"])
        accelerators = [d for d in self.devices if d not in ("cpu", "disk")]
        if "mps" in accelerators:
            self.main_devices: list[DeviceKey] = ["mps"]
        else:
            self.main_devices = [accelerators[0], "cpu"] if accelerators else ["cpu"]
        self.sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
        self.tied = find_tied_parameters(model)
        self.used = dict.fromkeys(self.devices, 0)
        self.buffers: dict[DeviceKey, int] = {}
        #: devices left empty because the next module did not fit: the bytes that module needed there
        self.minimum: dict[DeviceKey, int] = {}
        self.todo: list[tuple[str, Any]] = (list(model.named_parameters(recurse=False)) +
                                            list(model.named_children()) + list(model.named_buffers(recurse=False)))
        self.device_map: OrderedDict[str, DeviceKey] = OrderedDict()
        self.current = 0
        self._refresh_max_layer()

    def say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def _refresh_max_layer(self) -> None:
        modules = [(n, m) for n, m in self.todo if isinstance(m, nn.Module)]
        self.max_layer, self.max_layer_names = get_max_layer_size(modules, self.sizes, self.classes)

    def tied_outside(self, name: str) -> list[str]:
        """Parameters tied to one inside ``name`` that live outside it."""
        return _outside(name, self.tied)

    def children_of(self, name: str, module: Any) -> list[tuple[str, Any]]:
        if isinstance(module, torch.Tensor):
            return []
        children = list(module.named_children())
        if not children or type(module).__name__ in self.classes:
            return []
        items = list(module.named_parameters(recurse=False)) + children
        return [(f"{name}.{child}", sub) for child, sub in items]

    def place(self, name: str, module: Any, device: DeviceKey, size: int, tied_names: list[str]) -> None:
        self.used[device] += size
        self.device_map[name] = device
        for tied_name in tied_names:
            self.todo = [(n, m) for n, m in self.todo if n != tied_name]
            self.device_map[tied_name] = device
        if not self.offload_buffers and isinstance(module, nn.Module):
            buffers = compute_module_total_buffer_size(module, self.dtype, self.special_dtypes)
            self.buffers[device] = self.buffers.get(device, 0) + buffers
        self.say(f"Putting {name}{' and ' + str(tied_names) if tied_names else ''} (size={size}) on {device}.")

    def step(self) -> None:
        name, module = self.todo.pop(0)
        self.say(f"\nTreating module {name}.")
        self.max_layer_names = [n for n in self.max_layer_names if n != name and not n.startswith(name + ".")]
        if not self.max_layer_names:
            self._refresh_max_layer()
        size = self.sizes[name]
        tied = self.tied_outside(name)
        device = self.devices[self.current]
        limit = None if device == "disk" else self.memory[device]
        reserved = 0
        if device in self.main_devices and limit is not None:
            limit -= self.max_layer
            reserved = self.max_layer
        with_ties, tied_names, tied_modules = get_module_size_with_ties(tied, size, self.sizes, self.todo)
        if limit is None or self.used[device] + with_ties <= limit:
            self.place(name, module, device, with_ties, tied_names)
            return
        if tied and self.used[device] + size <= limit and self._split_tied(name, module, tied_names, tied_modules):
            return
        if self.used[device] + size >= limit:
            children = self.children_of(name, module)
            if children:
                self.say(f"Splitting {name}.")
                self.todo = children + self.todo
                self._refresh_max_layer()
                return
        if self.fallback and self.used[device] == 0 and device != "disk":
            # an empty device: rather than leave it unused, put the first smaller module that fits on it
            room = self.memory[device] - max(self.max_layer, with_ties)
            found, found_module, rest = fallback_allocate(self.todo, self.sizes, room, self.classes, self.tied)
            if found is not None:
                self.todo = [(found, found_module), (name, module)] + rest
                return
        self.say(f"Not enough space on {device} for {name} (size {with_ties}); moving to the next device.")
        if self.used[device] == 0 and device != "disk":
            self.minimum[device] = with_ties + reserved
        self.used[device] += reserved
        self.current += 1
        self.todo.insert(0, (name, module))

    def _split_tied(self, name: str, module: Any, tied_names: list[str], tied_modules: list[Any]) -> bool:
        """Replace the first splittable module tied to ``name`` by its children; False if none can split."""
        for tied_name, tied_module in zip(tied_names, tied_modules):
            children = self.children_of(tied_name, tied_module)
            if not children:
                continue
            self.say(f"Splitting {tied_name} (tied to {name}).")
            index = next(i for i, (n, _) in enumerate(self.todo) if n == tied_name)
            self.todo = [(name, module)] + self.todo[:index] + children + self.todo[index + 1:]
            self._refresh_max_layer()
            return True
        return False


def infer_auto_device_map(model: nn.Module, max_memory: dict[DeviceKey, int | str] | None = None,
                          no_split_module_classes: list[str] | None = None, dtype: torch.dtype | str | None = None,
                          special_dtypes: Mapping[str, torch.dtype | str] | None = None, verbose: bool = False,
                          clean_result: bool = True, offload_buffers: bool = False,
                          fallback_allocation: bool = False) -> dict[str, DeviceKey]:
    """Plan where each part of ``model`` goes: accelerators first, then ``"cpu"``, then ``"disk"``.

    Args:
        model: the model (may be on the meta device).
        max_memory: bytes (or ``"10GiB"`` strings) per device; defaults to the free memory of this machine.
            Device indices need not exist here: ``{0: "1GB", 1: "1GB", "cpu": "4GB"}`` plans for two GPUs.
        no_split_module_classes: class names of blocks that must stay whole (residual blocks).
        dtype: the dtype the weights will be loaded in; ``special_dtypes`` overrides it per tensor.
        verbose: print each decision.
        clean_result: merge the entries of a module whose parts all landed on one device.
        offload_buffers: whether buffers of offloaded modules are offloaded too (only changes the warning
            about buffers that must stay on the accelerator).
        fallback_allocation: when an accelerator would be left empty because the next module does not fit,
            put the first smaller module that does fit there first (depth first, as Accelerate does).

    Example:
        >>> device_map = infer_auto_device_map(model, {0: "1GB", "cpu": "8GB"}, ["LlamaDecoderLayer"])
    """
    planner = _Planner(model, get_max_memory(max_memory), _class_names(no_split_module_classes), dtype,
                       special_dtypes, offload_buffers, verbose, fallback_allocation)
    while planner.todo:
        planner.step()
    device_map = clean_device_map(planner.device_map) if clean_result else planner.device_map
    _warn_buffers(planner)
    if planner.minimum:
        needed = "\n".join(f"  - {device}: {size} bytes required" for device, size in planner.minimum.items())
        logger.info("No module could be assigned to these devices because of insufficient memory:\n%s\nThe "
                    "numbers are for this plan; give those devices at least that much memory, or pass "
                    "fallback_allocation=True to put a smaller module there first.", needed)
    return dict(device_map)


def _warn_buffers(planner: _Planner) -> None:
    offloaded = planner.buffers.get("cpu", 0) + planner.buffers.get("disk", 0)
    accelerators = [d for d in planner.memory if d not in ("cpu", "disk")]
    if offloaded and not planner.offload_buffers and accelerators:
        fits = any(planner.memory[d] >= offloaded + planner.used.get(d, 0) for d in accelerators)
        if not fits:
            warnings.warn(f"The offloaded layers hold {offloaded} bytes of buffers that must stay on an "
                          "accelerator, which seems not to fit any accelerator's remaining memory; pass "
                          "offload_buffers=True if you run out of memory.", stacklevel=3)


def _module_tensor_names(model: nn.Module) -> tuple[set[str], list[str]]:
    modules = {name for name, _ in model.named_modules(remove_duplicate=False)}
    tensors = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    tensors += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    return modules | set(tensors), tensors


def fallback_allocate(modules: list[tuple[str, Any]], module_sizes: Mapping[str, int], size_limit: int | str,
                      no_split_module_classes: list[str] | None = None,
                      tied_parameters: list[list[str]] | None = None) -> tuple[str | None, Any, list[tuple[str, Any]]]:
    """The first module (depth first, opening splittable ones) that fits in ``size_limit`` with its tied
    modules: ``(name, module, what is left of modules)``, or ``(None, None, modules)`` when none fits."""
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    classes = _class_names(no_split_module_classes)
    pending, found = list(modules), None
    while pending:
        name, module = pending.pop(0)
        tied = _outside(name, tied_parameters or [])
        if get_module_size_with_ties(tied, module_sizes[name], module_sizes, pending)[0] <= limit:
            found = name
            break
        if isinstance(module, nn.Module) and type(module).__name__ not in classes:
            children = list(module.named_children())
            if children:
                items = list(module.named_parameters(recurse=False)) + children
                pending = [(f"{name}.{child}", sub) for child, sub in items] + pending
    if found is None:
        return None, None, modules
    rest = list(modules)
    for index, char in enumerate(found):  # open each ancestor of the found module in place
        names = [n for n, _ in rest]
        if char == "." and found[:index] in names:
            at = names.index(found[:index])
            parent: nn.Module = rest[at][1]
            items = list(parent.named_parameters(recurse=False)) + list(parent.named_children())
            rest[at:at + 1] = [(f"{found[:index]}.{child}", sub) for child, sub in items]
    at = [n for n, _ in rest].index(found)
    return found, rest.pop(at)[1], rest


def _outside(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """Parameters tied to one inside ``name`` that live outside it."""
    groups = [g for g in tied_parameters if any((k + ".").startswith(name + ".") for k in g)
              and not all((k + ".").startswith(name + ".") for k in g)]
    return [k for g in groups for k in g if not (k + ".").startswith(name + ".")]


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise if ``device_map`` leaves a tensor of ``model`` without a device (listing them all, before anything
    is moved); warn (``UserWarning``, as Accelerate does) about keys that name nothing in the model."""
    known, tensors = _module_tensor_names(model)
    unknown = [name for name in device_map if name not in known]
    problems = []
    if unknown:
        warnings.warn(f"device_map keys do not match any submodules in the model: {unknown} are not in "
                      f"{type(model).__name__}, and are ignored; keys are module, parameter or buffer names such "
                      f"as {_examples(model)}", UserWarning, stacklevel=2)
    if "" not in device_map:
        state = set(model.state_dict(keep_vars=True))
        missing = [t for t in tensors if t in state and not _covered(t, device_map)]
        if missing:
            problems.append(f"the device_map gives no device for these tensors: {', '.join(missing)}; "
                            "add their modules (or '' for everything else) to the map")
    if problems:
        raise ValueError("; ".join(problems))


def _device_for(name: str, device_map: Mapping[str, Any]) -> Any:
    """The device of the closest entry holding ``name`` (``"a.b.c"`` -> ``a.b.c``, ``a.b``, ``a``, ``""``)."""
    probe = name
    while probe:
        if probe in device_map:
            return device_map[probe]
        probe = probe.rpartition(".")[0]
    return device_map.get("")


def _covered(name: str, device_map: Mapping[str, Any]) -> bool:
    return _device_for(name, device_map) is not None or "" in device_map


def _examples(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_children()][:4]


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge entries: a module whose listed parts all go to one device becomes one entry (in place)."""
    prefix = f"{module_name}." if module_name else ""
    keys = [k for k in device_map if k.startswith(prefix)] if prefix else list(device_map)
    values = [device_map[k] for k in keys]
    if len(values) > 1 and len({str(v) for v in values}) == 1:
        for key in keys:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {".".join(k.split(".")[:depth]) for k in list(device_map)
                if k.startswith(prefix) and len(k) > len(module_name)}
    for child in children:
        clean_device_map(device_map, child)
    return device_map
