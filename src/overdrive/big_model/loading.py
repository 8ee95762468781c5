"""Loading checkpoints into a model, shard by shard: ``load_checkpoint_in_model`` and
``load_checkpoint_and_dispatch``.

Everything that can be wrong is checked first, and reported together: the device map (unknown names,
tensors without a device), the offload folder, every shard's integrity, and the checkpoint's names and
shapes against the model's. Only then are weights written, one tensor at a time. A weight of a
safetensors shard that goes to the CPU of a model without storage (built under ``init_empty_weights``)
in its stored dtype is not copied at all: it stays in the file's copy-on-write mapping (page cache,
shared by every process loading the same file; see :mod:`overdrive.big_model.mapped_files`). Any other
weight is read straight from the file into its final buffer.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from overdrive.big_model.checkpoint_files import Checkpoint, CheckpointError, Shard, open_checkpoint
from overdrive.big_model.dispatch import dispatch_model
from overdrive.big_model.offload import load_offloaded_weights, offload_weight, save_offload_index
from overdrive.big_model.planning import (
    _device_for,
    check_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from overdrive.big_model.sizes import (
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
)
from overdrive.big_model.tensors import module_and_leaf, set_module_tensor_to_device

logger = logging.getLogger(__name__)

__all__ = ["load_checkpoint_in_model", "load_checkpoint_and_dispatch"]

_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not a torch dtype (for example 'float16', 'bfloat16', 'float32')")
    return found


def _keep_fp32(name: str, keep_in_fp32_modules: list[str] | None) -> bool:
    return any(name == key or name.startswith(key + ".") or f".{key}." in f".{name}"
               for key in keep_in_fp32_modules or ())


def _check_keys(model: nn.Module, checkpoint: Checkpoint, strict: bool) -> set[str]:
    """Compare names and shapes; raise listing every problem, or return the checkpoint names to skip."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    found = checkpoint.shapes()
    unexpected = sorted(set(found) - set(expected))
    tied = {name: group for group in find_tied_parameters(model) for name in group}
    missing = [n for n in expected if n not in found and not any(t in found for t in tied.get(n, ()))]
    mismatched = [f"{n}: checkpoint {list(found[n])}, model {list(expected[n])}"
                  for n in expected if n in found and found[n] != expected[n]]
    empty = [n for n in missing if getattr(*module_and_leaf(model, n)).device.type == "meta"]
    problems = []
    if mismatched:
        problems.append("shapes differ for " + "; ".join(mismatched))
    if strict and missing:
        problems.append(f"the checkpoint lacks {missing}")
    elif empty:
        problems.append(f"the checkpoint lacks {empty}, which the model holds on the meta device (no data; "
                        "if they are tied to other weights, call model.tie_weights() before loading)")
    if strict and unexpected:
        problems.append(f"the checkpoint has tensors the model does not: {unexpected}")
    if problems:
        raise CheckpointError(f"checkpoint {checkpoint.source} does not fit {type(model).__name__}: "
                              + "; ".join(problems) + ". Nothing was loaded.")
    if missing:
        logger.warning("Some weights of %s were not in the checkpoint %s and keep their current values: %s",
                       type(model).__name__, checkpoint.source, missing)
    if unexpected:
        logger.warning("Some weights of the checkpoint %s were not used when initializing %s (the model has no "
                       "such names): %s", checkpoint.source, type(model).__name__, unexpected)
    return set(unexpected)


def _check_map(model: nn.Module, device_map: Mapping[str, Any] | None, offload_folder: Any) -> None:
    if device_map is None:
        return
    check_device_map(model, device_map)
    disk = [name for name, device in device_map.items() if device == "disk"]
    if disk and offload_folder is None:
        raise ValueError(f"the device_map puts {disk} on 'disk' but offload_folder is None; pass "
                         "offload_folder='some/folder' to write those weights to")


class _Writer:
    """Puts each checkpoint tensor where the map says: into the model, the offload folder or the
    temporary CPU folder (``offload_state_dict``)."""

    def __init__(self, model: nn.Module, device_map: Mapping[str, Any] | None, dtype: torch.dtype | None,
                 keep_in_fp32_modules: list[str] | None, offload_folder: Any, offload_buffers: bool,
                 state_dict_folder: str | None, offload_in_place: bool = False) -> None:
        self.model, self.device_map, self.dtype = model, device_map, dtype
        self.keep, self.offload_folder, self.offload_buffers = keep_in_fp32_modules, offload_folder, offload_buffers
        self.buffers = {name for name, _ in model.named_buffers()}
        self.state_dict_folder = state_dict_folder
        self.offload_in_place = offload_in_place
        self.offload_index: dict[str, Any] = {}
        self.state_dict_index: dict[str, Any] = {}

    def target_dtype(self, name: str, stored: torch.dtype, old: torch.Tensor) -> torch.dtype:
        """The model's dtype wins (as in ``load_state_dict``) unless a load ``dtype`` was asked for."""
        if self.dtype is None or not (stored.is_floating_point and old.is_floating_point()):
            return old.dtype
        return torch.float32 if _keep_fp32(name, self.keep) else self.dtype

    def write(self, shard: Shard, name: str, read: Any) -> None:
        owner, leaf = module_and_leaf(self.model, name)
        old = getattr(owner, leaf)
        if self.device_map is not None:
            device = _device_for(name, self.device_map)
        else:
            device = "cpu" if old.device.type == "meta" else old.device
        dtype = self.target_dtype(name, shard.dtypes[name], old)
        if device == "disk" and (self.offload_buffers or name not in self.buffers):
            self._offload(shard, name, read, dtype, self.offload_folder, self.offload_index)
        elif str(device) == "cpu" and self.state_dict_folder is not None:
            self._offload(shard, name, read, dtype, self.state_dict_folder, self.state_dict_index, copy=True)
        elif (old.device.type == "cpu" and str(device) == "cpu" and old.dtype == dtype == shard.dtypes[name]
              and old.is_contiguous()):
            with torch.no_grad():
                read(out=old.data)  # in place: no second copy of a model that already has storage
        elif old.device.type == "meta" and str(device) in ("cpu", "disk") and dtype == shard.dtypes[name]:
            # zero-copy: the weight stays in the file's (copy-on-write) mapping, in the shared page cache
            set_module_tensor_to_device(self.model, name, "cpu", value=read(mapped=True), dtype=dtype)
        else:
            set_module_tensor_to_device(self.model, name, "cpu" if device == "disk" else device,
                                        value=read(), dtype=dtype)

    def _offload(self, shard: Shard, name: str, read: Any, dtype: torch.dtype, folder: str, index: dict,
                 copy: bool = False) -> None:
        if not copy and self.offload_in_place and shard.safetensors is not None:
            # the checkpoint already holds this weight in a lazily readable form: point at it, copy nothing
            # (the index's dtype makes the reader cast it, as transformers' offload index does)
            index[name] = {"safetensors_file": os.path.abspath(shard.path), "weight_name": name,
                           "dtype": str(dtype).removeprefix("torch.")}
        else:
            offload_weight(read().to(dtype), name, folder, index=index)
        set_module_tensor_to_device(self.model, name, "meta", dtype=dtype)


def load_checkpoint_in_model(model: nn.Module, checkpoint: str | os.PathLike[str],
                             device_map: Mapping[str, Any] | None = None,
                             offload_folder: str | os.PathLike[str] | None = None,
                             dtype: torch.dtype | str | None = None, offload_state_dict: bool = False,
                             offload_buffers: bool = False, keep_in_fp32_modules: list[str] | None = None,
                             offload_8bit_bnb: bool = False, strict: bool = False, full_state_dict: bool = True,
                             broadcast_from_rank0: bool = False, offload_in_place: bool = False) -> None:
    """Load ``checkpoint`` (a file, a sharded folder or its ``*.index.json``) into ``model``, which may be
    on the meta device.

    Args:
        device_map: where each part goes (``"disk"`` parts are written to ``offload_folder`` as ``.dat``
            files, as Accelerate writes them). Default: the CPU.
        dtype: cast floating weights to it, except those under ``keep_in_fp32_modules`` (kept in fp32).
        offload_state_dict: stage the CPU part on disk while loading (lowers peak RAM further).
        strict: refuse checkpoints with missing or unexpected names (shape mismatches are always refused).
        offload_in_place: overdrive's switch: ``"disk"`` weights of a safetensors checkpoint are not copied;
            the offload index points into the checkpoint's shards (faster, no second copy on disk).

    Every problem (bad map, missing offload folder, corrupt shard, names or shapes that do not match) is
    raised before any weight changes. ``offload_8bit_bnb``, ``full_state_dict`` and
    ``broadcast_from_rank0`` are accepted for Accelerate compatibility.
    """
    dtype = _as_dtype(dtype)
    _check_map(model, device_map, offload_folder)
    opened = open_checkpoint(checkpoint)
    skip = _check_keys(model, opened, strict)
    tied = find_tied_parameters(model)
    if device_map is not None:
        check_tied_parameters_on_same_device(tied, device_map)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="overdrive-state-") if offload_state_dict else None
    writer = _Writer(model, device_map, dtype, keep_in_fp32_modules, offload_folder, offload_buffers, staging,
                     offload_in_place)
    try:
        for shard in opened.shards:
            # no gc.collect() between shards (Accelerate's habit): nothing here forms reference cycles, so
            # each tensor and a .bin shard's mapping are freed by reference counting as soon as they are
            # done, while a full collection walks every object of a process that has imported transformers
            for name, read in shard.tensors():
                if name not in skip:
                    writer.write(shard, name, read)
        if offload_folder is not None:
            save_offload_index(writer.offload_index, offload_folder)
        if staging is not None:
            load_offloaded_weights(model, writer.state_dict_index, staging)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    retie_parameters(model, tied)


def load_checkpoint_and_dispatch(model: nn.Module, checkpoint: str | os.PathLike[str],
                                 device_map: str | Mapping[str, Any] | None = None,
                                 max_memory: dict[int | str, int | str] | None = None,
                                 no_split_module_classes: list[str] | None = None,
                                 offload_folder: str | os.PathLike[str] | None = None, offload_buffers: bool = False,
                                 dtype: torch.dtype | str | None = None, offload_state_dict: bool | None = None,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None, force_hooks: bool = False,
                                 strict: bool = False, full_state_dict: bool = True,
                                 broadcast_from_rank0: bool = False,
                                 keep_in_fp32_modules: list[str] | None = None,
                                 offload_in_place: bool = False) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (usually built under ``init_empty_weights``) and dispatch it.

    ``device_map`` is a dict, or ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"`` / ``"sequential"``
    to plan one from ``max_memory``; ``no_split_module_classes`` names blocks that must stay whole.
    ``keep_in_fp32_modules`` and ``offload_in_place`` (not in Accelerate's signature) are passed to
    ``load_checkpoint_in_model``.

    Example:
        >>> with init_empty_weights():
        ...     model = MyModel(config)
        >>> model = load_checkpoint_and_dispatch(model, "ckpt/", device_map="auto", offload_folder="offload")
    """
    if isinstance(device_map, str):
        if device_map not in _AUTO_MAPS:
            raise ValueError(f"device_map {device_map!r} is not a map nor one of {list(_AUTO_MAPS)}")
        budget: dict[Any, Any] | None = max_memory
        if device_map != "sequential":
            budget = get_balanced_memory(model, max_memory, no_split_module_classes, dtype=dtype,
                                         low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, budget, no_split_module_classes, dtype=dtype,
                                           offload_buffers=offload_buffers)
    # Accelerate stages the CPU part on disk by default when some of it goes to disk, to keep one shard
    # plus the model in memory; loading tensor by tensor already does that, so staging is opt-in here.
    offload_state_dict = bool(offload_state_dict)
    load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
                             keep_in_fp32_modules=keep_in_fp32_modules, offload_in_place=offload_in_place)
    if device_map is None:
        return model
    return dispatch_model(model, device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
                          skip_keys=skip_keys, preload_module_classes=preload_module_classes, force_hooks=force_hooks)
