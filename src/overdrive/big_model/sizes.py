"""How big a model and its parts are, how much memory each device has, and which parameters are tied.

All sizes are computed from shapes and dtypes, so a model on the meta device (built under
:func:`~overdrive.big_model.init.init_empty_weights`) is measured exactly like a real one.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any, Union

import torch
from torch import nn

logger = logging.getLogger(__name__)

DeviceKey = Union[int, str]

__all__ = [
    "convert_file_size_to_int", "dtype_byte_size", "named_module_tensors", "get_non_persistent_buffers",
    "compute_module_sizes", "compute_module_total_buffer_size", "get_max_layer_size", "find_tied_parameters",
    "retie_parameters", "get_module_size_with_ties", "check_tied_parameters_on_same_device", "get_max_memory",
    "id_tensor_storage", "check_tied_parameters_in_config", "calculate_maximum_sizes", "check_device_same",
    "get_module_leaves",
]

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?I?B)\s*$", re.IGNORECASE)


def convert_file_size_to_int(size: int | str) -> int:
    """``"10GB"`` -> 10**10, ``"1GiB"`` -> 2**30, ``"8Gb"`` (bits) -> 10**9, an int -> itself."""
    if isinstance(size, int):
        return size
    match = _SIZE.match(str(size))
    if match is None:
        raise ValueError(f"size {size!r} is not understood; write an int (bytes) or a number with a unit "
                         f"such as '500MB', '1.5GB', '2GiB' (valid units: {', '.join(_UNITS)})")
    number, unit = float(match.group(1)), match.group(2)
    value = number * _UNITS[unit.upper()]
    if unit.endswith("b"):  # Accelerate's convention: a lowercase b means bits
        value /= 8
    return int(value)


def dtype_byte_size(dtype: torch.dtype | str) -> float:
    """Bytes per element: ``torch.float32`` -> 4, ``torch.bool`` -> 1/8, ``"int4"`` -> 0.5.

    A ``torch.dtype`` counts its storage (``itemsize``): ``torch.uint4`` takes one byte, as in Accelerate;
    the packed sizes are for the names (``"int4"``, ``"int2"``, ``CustomDtype``) of quantized weights.
    """
    if dtype == torch.bool:
        return 1 / 8
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    name = str(dtype)
    if name in ("int4", "uint4", "fp4"):
        return 0.5
    if name in ("int2",):
        return 0.25
    match = re.search(r"[^\d](\d+)_?", name)
    if match is None:
        raise ValueError(f"dtype {dtype!r} is not a valid dtype (expected a torch.dtype or a name such as "
                         f"'float16', 'int8', 'int4')")
    return int(match.group(1)) / 8


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers of ``module`` that are not saved in its state dict; with ``recurse``, those of
    its submodules too, as dotted names when ``fqns`` (Accelerate's default gives their bare names)."""
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, child in module.named_modules():
            if prefix:
                names |= {f"{prefix}.{name}" if fqns else name for name in child._non_persistent_buffers_set}
    return names


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters (then, with ``include_buffers``, the buffers) of ``module`` with their names."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        return found if isinstance(found, torch.dtype) else dtype
    return dtype


def _keeps_dtype(tensor: torch.Tensor) -> bool:
    """Integer and bool tensors are never cast by a load dtype (ids, masks, quantized storage)."""
    return not (tensor.is_floating_point() or tensor.is_complex())


def _tensor_size(name: str, tensor: torch.Tensor, dtype: Any, special: Mapping[str, Any] | None) -> int:
    if special is not None and name in special:
        return int(tensor.numel() * dtype_byte_size(_as_dtype(special[name])))
    own = dtype_byte_size(tensor.dtype)
    if dtype is None or _keeps_dtype(tensor):
        return int(tensor.numel() * own)
    # a load dtype only ever shrinks a tensor: Accelerate never upcasts fp16 weights to an fp32 dtype
    return int(tensor.numel() * min(own, dtype_byte_size(_as_dtype(dtype))))


def compute_module_sizes(model: nn.Module, dtype: torch.dtype | str | None = None,
                         special_dtypes: Mapping[str, torch.dtype | str] | None = None,
                         buffers_only: bool = False) -> dict[str, int]:
    """Bytes of every module and tensor of ``model``, keyed by dotted name (``""`` is the whole model).

    ``dtype`` is the dtype weights will be loaded in (floating tensors only), ``special_dtypes`` a
    per-tensor override. A tied parameter is counted once, under its first name.
    """
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        size = _tensor_size(name, tensor, dtype, special_dtypes)
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def compute_module_total_buffer_size(model: nn.Module, dtype: torch.dtype | str | None = None,
                                     special_dtypes: Mapping[str, torch.dtype | str] | None = None) -> int:
    """Bytes of all the buffers of ``model``."""
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True).get("", 0)


def get_max_layer_size(modules: list[tuple[str, Any]], module_sizes: Mapping[str, int],
                       no_split_module_classes: list[str] | tuple[str, ...] | set[str]) -> tuple[int, list[str]]:
    """The size of the biggest layer among ``modules`` and the names of all layers of that size.

    A layer is a module with no children or whose class is in ``no_split_module_classes`` (it can only
    move as a whole, so it is what must fit on a device at once).
    """
    biggest, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if children and type(module).__name__ not in no_split_module_classes:
            pending = [(f"{name}.{child}", sub) for child, sub in children] + pending
            continue
        size = module_sizes[name]
        if size > biggest:
            biggest, names = size, [name]
        elif size == biggest:
            names.append(name)
    return biggest, names


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that share one tensor, each group sorted: ``[["head.weight", "embed.weight"]]``."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        groups[id(param)].append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at one parameter again, the first that holds data (moving or
    loading a parameter replaces the object, which unties it)."""
    for group in tied_params:
        owners = []
        for name in group:
            owner_name, _, leaf = name.rpartition(".")
            owners.append((model.get_submodule(owner_name) if owner_name else model, leaf))
        params = [module._parameters[leaf] for module, leaf in owners]
        shared = next((p for p in params if p is not None and p.device.type != "meta"), params[0])
        for module, leaf in owners:
            module._parameters[leaf] = shared


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: Mapping[str, int],
                              modules_to_treat: list[tuple[str, Any]]) -> tuple[int, list[str], list[Any]]:
    """``module_size`` plus the sizes of the not-yet-placed modules holding ``tied_params`` (less the tied
    parameters themselves, which ``module_size`` already counts once), and those modules."""
    total, names, modules = module_size, [], []
    for param in tied_params:
        for name, module in modules_to_treat:
            if param.startswith(name + "."):
                if name not in names:
                    names.append(name)
                    modules.append(module)
                    total += module_sizes[name]
                total -= module_sizes.get(param, 0)
                break
    return total, names, modules


def _device_of(name: str, device_map: Mapping[str, Any]) -> Any:
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            raise ValueError(f"the device_map gives no device for {name!r} (nor for any module holding it)")
        probe = probe.rpartition(".")[0]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: Mapping[str, Any]) -> None:
    """Warn about each tied group whose names the device map puts on different devices."""
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len({str(d) for d in devices.values()}) > 1:
            logger.warning("Tied parameters are on different devices: %s. Put the modules holding them on one "
                           "device in your device_map, or use device_map='auto'.", devices)


def _free_cpu_memory() -> int:
    try:
        import psutil  # lazy: optional dependency

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is optional: Linux says the same in /proc/meminfo
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read the free CPU memory (no psutil and no MemAvailable in /proc/meminfo); "
                       "pass max_memory={'cpu': '16GB', ...} explicitly")


def _free_accelerator_memory() -> dict[DeviceKey, int]:
    found: dict[DeviceKey, int] = {}
    if not torch.accelerator.is_available():
        return found
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == "mps":
        return found  # mps shares the CPU's memory: Accelerate reports it under "mps"
    for index in range(torch.accelerator.device_count()):
        try:
            found[index] = int(torch.accelerator.get_memory_info(index)[0])
        except Exception as err:  # a device that cannot be initialised is left out, as Accelerate does
            logger.info("device %d left out of max_memory: %s", index, err)
    return found


def get_max_memory(max_memory: dict[DeviceKey, int | str] | None = None) -> dict[DeviceKey, int]:
    """The memory available per device, as ``{0: bytes, 1: bytes, ..., "cpu": bytes}``.

    Without ``max_memory``: the free memory of every accelerator ``torch.accelerator`` sees, and the
    available RAM under ``"cpu"`` (``"mps"`` on Apple machines). With it: its sizes turned into bytes
    (``"10GiB"``), ordered accelerators first, then ``"mps"``, ``"cpu"``, ``"disk"``. Device indices this
    machine does not have are kept (with a warning), so maps can be planned for other machines.
    """
    if max_memory is None:
        found = _free_accelerator_memory()
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        found["mps" if accelerator is not None and accelerator.type == "mps" else "cpu"] = _free_cpu_memory()
        return found
    bad = [key for key in max_memory if not isinstance(key, int) and key not in ("mps", "cpu", "disk")]
    if bad:
        raise ValueError(f"max_memory has unknown device(s) {bad}; valid keys are accelerator indices "
                         f"(0, 1, ...), 'mps', 'cpu' and 'disk'")
    # Converted in place on purpose: transformers compares the caller's dict with ours afterwards.
    for key, value in list(max_memory.items()):
        max_memory[key] = convert_file_size_to_int(value)
    indices = sorted(key for key in max_memory if isinstance(key, int))
    count = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
    missing = [i for i in indices if i < 0 or i >= count]
    if missing:
        logger.warning("max_memory names device(s) %s, which this machine does not have (it has %d); "
                       "planning for them anyway", missing, count)
    ordered = indices + [key for key in ("mps", "cpu", "disk") if key in max_memory]
    return {key: int(max_memory[key]) for key in ordered}


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """An identifier of the storage behind ``tensor``: equal for tensors sharing memory."""
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether ``model``'s config (a transformers model's) says some weights should be tied."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    word = bool(getattr(text, "tie_word_embeddings", False) and embeddings is not None)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)
                           and getattr(config, "tie_encoder_decoder", False))
    modules = any(hasattr(m, "_tie_weights") for m in model.modules())
    return word or encoder_decoder or modules


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total bytes, (bytes of the largest layer, its names))``; transformers models name their
    no-split blocks in ``_no_split_modules``."""
    sizes = compute_module_sizes(model)
    blocks = getattr(model, "_no_split_modules", None) or []
    top = (list(model.named_parameters(recurse=False)) + list(model.named_children())
           + list(model.named_buffers(recurse=False)))
    return sizes[""], get_max_layer_size(top, sizes, blocks)


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Whether two devices are the same, counting ``cuda`` as the current ``cuda:N``."""
    if first_device.type != second_device.type:
        return False
    if first_device.type != "cpu" and (first_device.index is None) != (second_device.index is None):
        current = torch.accelerator.current_device_index() if torch.accelerator.is_available() else 0
        return (first_device.index if first_device.index is not None else current) == \
            (second_device.index if second_device.index is not None else current)
    return first_device == second_device


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """Names in ``module_sizes`` with nothing below them (``""`` excluded)."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]
