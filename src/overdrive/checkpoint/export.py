"""Full model weights as safetensors shards: ``save_model``, ``get_state_dict`` and ``merge-weights``.

The layout is the one the Hugging Face ecosystem reads: ``model.safetensors`` when the weights fit in one
shard, else ``model-00001-of-0000N.safetensors`` plus ``model.safetensors.index.json`` (``weight_map``:
tensor name -> file, ``metadata.total_size``: bytes). Each shard loads with ``safetensors`` alone and the
merged dict with a plain model's ``load_state_dict``. A tensor that several names share (tied weights) is
stored once; the other names are listed under ``tied_weights`` in the metadata.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from overdrive.big_model.hooks import has_offloaded_params
from overdrive.big_model.state_dicts import get_state_dict_offloaded_model
from overdrive.checkpoint.accelerate_layout import indexed
from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import run_dcp
from overdrive.checkpoint.storage import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    read_json,
    read_manifest,
    verify_files,
)
from overdrive.helpers.unwrap import extract_model_from_parallel

SAFE_NAME, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_NAME, TORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"10GB"`` (10**9) or ``"500MiB"`` (2**20 each)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(size).upper())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"max_shard_size={size!r} is not a size; use bytes as an int or a string such as "
                         "'10GB', '500MB' or '2GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def get_state_dict(model: nn.Module, unwrap: bool = True, engine: Any = None) -> dict[str, Any]:
    """The model's full state dict, by plain names. A model that is not sharded (one process, DDP) gives
    the user's module's own ``state_dict()`` on every rank, as Accelerate does; a sharded one (FSDP2, tensor
    parallel, ZeRO-3, a pipeline) is gathered to the CPU, and then only rank 0 receives the tensors.
    ``unwrap=False`` returns the wrapper's own state dict. ``engine``: the strategy's engine checkpoint,
    which gathers the models it owns itself."""
    if not unwrap:
        return model.state_dict()
    if engine is not None and engine.owns(model):
        return engine.full_state_dict(model)
    gather: Callable[[], dict[str, Any]] | None = getattr(model, "gather_full_state_dict", None)
    if callable(gather):  # a pipelined model: the other stages' weights live on other processes
        return gather()
    if not _is_sharded(model):
        return extract_model_from_parallel(model, keep_torch_compile=False).state_dict()

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _is_sharded(model: nn.Module) -> bool:
    return any(isinstance(t, DTensor) for t in (*model.parameters(), *model.buffers()))


def save_model(model: nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
               safe_serialization: bool = True, is_main_process: bool = True, engine: Any = None) -> list[str]:
    """Write ``model``'s full weights to ``save_directory``; return the files written (main process only).

    Every process must call it under FSDP2 and ZeRO-3 (the weights are gathered); only the main process writes.
    """
    limit = parse_size(max_shard_size)

    if any(has_offloaded_params(module) for module in model.modules()):  # weights on disk / CPU behind hooks

        state = get_state_dict_offloaded_model(model)
    else:
        state = get_state_dict(model, engine=engine)
    if not is_main_process:
        return []
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    kept, tied = _untie(tensors)
    sizes = {name: _nbytes(tensors[name]) for name in kept}
    return write_shards(Path(save_directory), _plan_shards(kept, sizes, limit), sizes,
                        lambda names: {n: tensors[n] for n in names}, safe_serialization, tied)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _untie(tensors: dict[str, torch.Tensor]) -> tuple[list[str], dict[str, str]]:
    """Names to store, and ``{alias: stored name}`` for names that view the same data as a stored one."""
    seen: dict[tuple, str] = {}
    kept, tied = [], {}
    for name, tensor in tensors.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
            kept.append(name)
    return kept, tied


def _plan_shards(names: list[str], sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Consecutive names, cut before a shard would pass ``limit`` bytes (a bigger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name in names:
        if shards[-1] and used + sizes[name] > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += sizes[name]
    return shards


def write_shards(folder: Path, shards: list[list[str]], sizes: dict[str, int],
                 materialize: Callable[[list[str]], dict[str, torch.Tensor]], safe_serialization: bool = True,
                 tied: dict[str, str] | None = None) -> list[str]:
    """Write each shard (its tensors made by ``materialize(names)``, one shard in memory at a time), the
    index when there are several, and remove shards of an earlier save that the new one does not use."""
    folder.mkdir(parents=True, exist_ok=True)
    single, index_name = (SAFE_NAME, SAFE_INDEX) if safe_serialization else (TORCH_NAME, TORCH_INDEX)
    stem, suffix = single.split(".", 1)
    count = len(shards)
    files = [single] if count == 1 else [f"{stem}-{k + 1:05d}-of-{count:05d}.{suffix}" for k in range(count)]
    header = {"format": "pt"}
    if tied:
        header["tied_weights"] = json.dumps(tied, sort_keys=True)
    for file, names in zip(files, shards):
        tensors = {n: t.detach().to("cpu").contiguous() for n, t in materialize(names).items()}
        _write_one(folder / file, _separate(tensors), header, safe_serialization)
    written = list(files)
    if count > 1:
        index = {"metadata": {"total_size": sum(sizes.values()), **({"tied_weights": tied} if tied else {})},
                 "weight_map": {name: file for file, names in zip(files, shards) for name in names}}
        _atomic_write_text(folder / index_name, json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(index_name)
    elif (folder / index_name).exists():
        (folder / index_name).unlink()
    pattern = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{re.escape(suffix)}$")
    for stale in folder.iterdir():
        if pattern.match(stale.name) and stale.name not in files:
            stale.unlink()
    return [str(folder / name) for name in written]


def _separate(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors that still share memory with another one (safetensors refuses shared memory)."""
    owners: dict[int, str] = {}
    out = {}
    for name, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if tensor.numel() and ptr in owners else tensor
        owners.setdefault(ptr, name)
    return out


def _write_one(path: Path, tensors: dict[str, torch.Tensor], header: dict[str, str], safe: bool) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if safe:
        save_file(tensors, str(temporary), metadata=header)
    else:
        torch.save(tensors, temporary)
    os.replace(temporary, path)


def _atomic_write_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


# -- merge-weights --------------------------------------------------------------------------------
def merge_weights(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike, model_index: int = 0,
                  max_shard_size: int | str = "10GB", safe_serialization: bool = True, verify: bool = True,
                  allow_pickle: bool = False) -> list[str]:
    """Turn model ``model_index`` of a ``save_state`` checkpoint into full safetensors shards.

    Runs in one process without a process group, whatever the number of processes that saved it, and
    holds one shard in memory at a time.
    """


    folder = Path(checkpoint_dir)
    manifest = read_manifest(folder)
    problems = verify_files(folder, manifest, sorted(manifest["files"]), with_checksums=verify)
    if problems:
        raise CheckpointError(f"checkpoint {folder} is damaged:\n  " + "\n  ".join(problems))
    shard_limit = parse_size(max_shard_size)
    if manifest.get("contents", {}).get("layout") == "accelerate":
        sharded = folder / f"pytorch_model_fsdp_{model_index}"
        if not sharded.is_dir():
            order, sizes, materialize = _accelerate_file(folder, model_index)
            return write_shards(Path(output_dir), _plan_shards(order, sizes, shard_limit), sizes, materialize,
                                safe_serialization)
        folder, prefix = sharded, "model."  # Accelerate's FSDP2 folder: {"model": state}, flattened
    else:
        prefix = f"model_{model_index}."
    reader = SafeFileSystemReader(folder, allow_pickle=allow_pickle)
    saved = reader.read_metadata().state_dict_metadata
    entries = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
    tensors = {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}
    if not tensors:
        held = sorted({k.split(".", 1)[0] for k in saved if k.startswith(("model_", "model."))})
        raise CheckpointError(f"{folder} holds no weights for model {model_index} (it holds: "
                              f"{', '.join(held) or 'no model'})")
    order = _saved_order(folder, model_index, list(tensors))
    sizes = {n: _numel(tensors[n].size) * torch.empty((), dtype=tensors[n].properties.dtype).element_size()
             for n in order}

    def materialize(names: list[str]) -> dict[str, torch.Tensor]:
        out = {n: torch.empty(tensors[n].size, dtype=tensors[n].properties.dtype) for n in names}
        run_dcp(lambda: dcp.load({prefix + n: t for n, t in out.items()}, storage_reader=reader,
                                 planner=SafeLoadPlanner(allow_pickle), no_dist=True))
        return out

    shards = _plan_shards(order, sizes, shard_limit)
    return write_shards(Path(output_dir), shards, sizes, materialize, safe_serialization)


def _accelerate_file(folder: Path, model_index: int) -> tuple[list[str], dict[str, int], Any]:
    """Model ``model_index``'s names, sizes and reader from the Accelerate layout's ``model[_k].safetensors``
    (or ``pytorch_model[_k].bin``), ``k`` its place among the models the save wrote."""
    saved = list(read_json(folder / "state.json")["models"])
    if model_index not in saved:
        raise CheckpointError(f"{folder} holds no weights for model {model_index} (it holds models {saved}; a "
                              "DeepSpeed engine's are in its pytorch_model folder: use the zero_to_fp32.py beside it)")
    place = saved.index(model_index)
    safe, unsafe = folder / indexed("model", ".safetensors", place), folder / indexed("pytorch_model", ".bin", place)
    if safe.is_file():
        with safe_open(str(safe), "pt") as f:
            names = list(f.keys())
            sizes = {n: f.get_slice(n).get_shape() for n in names}
            dtypes = {n: f.get_slice(n).get_dtype() for n in names}
        widths = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}

        def read(chosen: list[str]) -> dict[str, torch.Tensor]:
            with safe_open(str(safe), "pt") as f:
                return {n: f.get_tensor(n) for n in chosen}
        return names, {n: _numel(sizes[n]) * widths.get(dtypes[n], 1) for n in names}, read
    if not unsafe.is_file():
        raise CheckpointError(f"{folder} has neither {safe.name} nor {unsafe.name} for model {model_index}")
    tensors = torch.load(unsafe, map_location="cpu", weights_only=True)
    return list(tensors), {n: _nbytes(t) for n, t in tensors.items()}, lambda chosen: {n: tensors[n] for n in chosen}


def _numel(size: Sequence[int]) -> int:
    count = 1
    for dim in size:
        count *= int(dim)
    return count


def _saved_order(folder: Path, model_index: int, names: list[str]) -> list[str]:
    """The model's own key order, as state.json recorded it (else the DCP metadata's)."""
    try:
        state = read_json(folder / "state.json")
        recorded = state["model_keys"][state["models"].index(model_index)]
    except (CheckpointError, KeyError, ValueError, IndexError):
        return names
    present = set(names)
    ordered = [n for n in recorded if n in present]
    return ordered + [n for n in names if n not in set(ordered)]


def _usage_mistake(checkpoint: Path, output: Path, model_index: int, overwrite: bool) -> str | None:
    """What is wrong with the command line itself (exit status 2), before any file is read."""
    if not checkpoint.is_dir():
        return f"checkpoint folder {checkpoint} does not exist" if not checkpoint.exists() else (
            f"{checkpoint} is a file; give the folder save_state wrote")
    if model_index < 0:
        return f"--model-index {model_index}: give 0 or more (0 = the first prepared model)"
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        return (f"{output} already exists and is not an empty folder: choose a new output folder, or pass "
                "--overwrite to replace the weights in it")
    return None


def merge_weights_main(argv: Sequence[str] | None = None) -> int:
    """``overdrive merge-weights CHECKPOINT OUT``: exit status 0 when written, 1 when the checkpoint is
    damaged or unreadable, 2 for a usage error (no such folder, no model of that index in it, an output
    folder that holds files without ``--overwrite``)."""
    parser = argparse.ArgumentParser(
        prog="overdrive merge-weights",
        description="Write a model of a save_state checkpoint as full safetensors shards (model.safetensors, or "
                    "model-0000k-of-0000n.safetensors + model.safetensors.index.json), without a process group.")
    parser.add_argument("checkpoint", help="a folder written by Accelerator.save_state")
    parser.add_argument("output", help="the folder to write the weights to")
    parser.add_argument("--model-index", "--model_index", type=int, default=0, dest="model_index",
                        help="which prepared model (0 = the first)")
    parser.add_argument("--max-shard-size", "--max_shard_size", default="10GB", dest="max_shard_size",
                        help="largest shard, e.g. 10GB, 500MB, 2GiB (default 10GB)")
    parser.add_argument("--unsafe-serialization", action="store_true",
                        help="write pytorch_model*.bin with torch.save instead of safetensors")
    parser.add_argument("--no-verify", action="store_true", help="skip the checksums (sizes are still checked)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an output folder that already holds files (its old shards are removed)")
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    mistake = _usage_mistake(Path(args.checkpoint), Path(args.output), args.model_index, args.overwrite)
    if mistake:
        print(f"overdrive merge-weights: error: {mistake}", file=sys.stderr)
        return 2
    try:
        written = merge_weights(args.checkpoint, args.output, model_index=args.model_index,
                                max_shard_size=args.max_shard_size, safe_serialization=not args.unsafe_serialization,
                                verify=not args.no_verify)
    except (CheckpointError, ValueError) as exc:
        usage = isinstance(exc, ValueError) or "holds no weights for model" in str(exc)
        print(f"overdrive merge-weights: error: {exc}", file=sys.stderr)
        return 2 if usage else 1
    for path in written:
        print(path)
    return 0
