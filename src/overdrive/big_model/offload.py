"""Weights kept out of memory: the offload folder format and the lazy mappings hooks read weights from.

The folder holds one raw array per tensor, ``<name>.dat`` (written with ``numpy.memmap``), and
``index.json``: ``{name: {"dtype": "float16", "shape": [4096, 4096]}}`` (bfloat16 stored as int16 bits).
An index entry may instead point into an existing safetensors file:
``{"safetensors_file": path, "weight_name": key, "dtype": ...}`` (what transformers writes, so weights
already on disk in a checkpoint are not copied). This is Accelerate's format: folders written by either
library load in the other. Nothing is ever pickled, and reads are lazy: a weight is mapped when a forward
needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from overdrive.big_model.safetensors_io import SafetensorsFile
from overdrive.big_model.tensors import set_module_tensor_to_device

__all__ = ["offload_weight", "load_offloaded_weight", "save_offload_index", "offload_state_dict",
           "load_offloaded_weights", "PrefixedDataset", "OffloadedWeightsLoader", "extract_submodules_state_dict",
           "INDEX_FILE"]

INDEX_FILE = "index.json"


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"offload index dtype {name!r} is not a torch dtype")
    return dtype


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str],
                   index: dict | None = None) -> dict | None:
    """Write ``weight`` to ``offload_folder/<weight_name>.dat`` and record it in ``index`` (returned)."""
    dtype_name = None
    weight = weight.detach()
    if weight.dtype == torch.bfloat16:  # numpy has no bfloat16: store the bits as int16
        weight = weight.view(torch.int16)
        dtype_name = "bfloat16"
    elif str(weight.dtype).startswith("torch.float8_"):  # nor fp8: store the bytes as int8 (Accelerate's index)
        dtype_name = str(weight.dtype).split(".")[1]
        weight = weight.view(torch.int8)
    array = weight.cpu().numpy()
    if index is not None:
        index[weight_name] = {"dtype": dtype_name or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:
        array = array[None]
    path = os.path.join(os.fspath(offload_folder), f"{weight_name}.dat")
    on_disk = np.memmap(path, dtype=array.dtype, mode="w+", shape=array.shape)
    on_disk[:] = array[:]
    on_disk.flush()
    del on_disk
    return index


def load_offloaded_weight(weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any],
                          copy: bool = True) -> torch.Tensor:
    """Read one ``.dat`` weight. ``copy=False`` returns a zero-copy view of a private memory map (what
    the offload hooks use: the data is paged in by the forward that reads it)."""
    shape = tuple(weight_info["shape"]) or (1,)
    name = weight_info["dtype"]
    fp8 = name.startswith("float8_")
    stored = "int16" if name == "bfloat16" else "int8" if fp8 else name
    mapped = np.memmap(weight_file, dtype=stored, shape=shape, mode="c")
    tensor = torch.tensor(mapped) if copy else torch.from_numpy(mapped)
    if not weight_info["shape"]:
        tensor = tensor[0]
    if name == "bfloat16" or fp8:
        tensor = tensor.view(getattr(torch, name))
    return tensor


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]) -> None:
    """Merge ``index`` into ``offload_folder/index.json`` (written whole, then renamed into place)."""
    if not index:
        return
    path = os.path.join(os.fspath(offload_folder), INDEX_FILE)
    current: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            current = json.load(file)
    current.update(index)
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        json.dump(current, file, indent=2)
    os.replace(path + ".tmp", path)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` in the offload format."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Any] | None,
                           offload_folder: str | os.PathLike[str]) -> None:
    """Load every weight of ``index`` from ``offload_folder`` into ``model`` on the CPU."""
    for name, info in (index or {}).items():
        weight = load_offloaded_weight(os.path.join(os.fspath(offload_folder), f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight)


def extract_submodules_state_dict(state_dict: Mapping[str, torch.Tensor],
                                  submodule_names: list[str]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` under any of ``submodule_names`` (``layers.1`` does not take ``layers.10``)."""
    names = set(submodule_names)
    if "" in names:
        return dict(state_dict)
    result = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if any(".".join(parts[:depth]) in names for depth in range(1, len(parts) + 1)):
            result[key] = value
    return result


class PrefixedDataset(Mapping):
    """The entries of ``dataset`` under ``prefix``, with the prefix taken off their names."""

    def __init__(self, dataset: Mapping[str, Any], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self) -> Iterator[str]:
        return (key[len(self.prefix):] for key in self.dataset if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping name -> tensor over weights in memory (``state_dict``, read first) and on
    disk (``save_folder`` with its ``index.json``, or an explicit ``index``).

    Disk weights are returned as zero-copy views of a private memory map (``.dat`` files and
    safetensors alike), cast to the dtype the index names and moved to ``device`` if one is given.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor] | None = None,
                 save_folder: str | os.PathLike[str] | None = None, index: Mapping[str, Any] | None = None,
                 device: Any = None) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index of offloaded "
                             "weights; none was given")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = None if save_folder is None else os.fspath(save_folder)
        if index is None and self.save_folder is not None:
            path = os.path.join(self.save_folder, INDEX_FILE)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{self.save_folder} has no {INDEX_FILE}: it is not an offload folder "
                                        "(offload_state_dict or disk_offload writes one)")
            with open(path, encoding="utf-8") as file:
                index = json.load(file)
        self.index = {} if index is None else dict(index)
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self.device = device
        self._files: dict[str, Any] = {}

    def _safetensors(self, path: str) -> Any:
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        return self._files[path]

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is not None:
            tensor = self._safetensors(info["safetensors_file"]).view(info.get("weight_name", key))
        else:
            if self.save_folder is None:
                raise KeyError(f"{key!r} is offloaded to a .dat file but this loader has no save_folder")
            tensor = load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info, copy=False)
        if "dtype" in info:  # a no-op when the stored dtype is already the one asked for
            tensor = tensor.to(_dtype_from_name(info["dtype"]))
        if self.device is not None:
            tensor = tensor.to(self.device)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)

    def __contains__(self, key: object) -> bool:
        return key in self.state_dict or key in self.index
