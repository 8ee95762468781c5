"""How much memory a model needs, from its config alone: Accelerate's ``estimate-memory`` table.

The model is built under :func:`~overdrive.big_model.init.init_empty_weights` (no weights in memory, no
download): from a local folder holding ``config.json``, a config file, or a hub name already in the local
cache. Sizes are those of fp32 weights scaled per dtype; "Training using Adam" is the peak of weights,
gradients and the two Adam moments (Accelerate's estimate, for a batch of 1).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from overdrive.big_model.init import init_empty_weights
from overdrive.big_model.sizes import calculate_maximum_sizes
from overdrive.config.choices import invalid_choice

__all__ = ["DTYPES", "MemoryRow", "create_empty_model", "estimate_memory", "format_table", "convert_bytes"]

DTYPES = ("float32", "float16", "int8", "int4")
_DIVISOR = {"float32": 1, "float16": 2, "bfloat16": 2, "int8": 4, "int4": 8}


@dataclass
class MemoryRow:
    """One dtype's line of the table, in bytes (``training_adam`` is None where Accelerate says N/A)."""

    dtype: str
    largest_layer: float
    total_size: float
    training_adam: float | None
    largest_layer_names: list[str]


def _transformers_model(source: str, trust_remote_code: bool) -> nn.Module:
    import transformers  # lazy: optional dependency

    config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code,
                                                     local_files_only=True)
    constructor: Any = transformers.AutoModel
    for key in getattr(config, "auto_map", None) or {}:
        if key.startswith("AutoModelFor"):
            constructor = getattr(transformers, key)
            break
    with init_empty_weights():
        return constructor.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)


def _timm_model(source: str) -> nn.Module:
    try:
        import timm  # pyright: ignore[reportMissingImports]  # lazy: optional dependency
    except ImportError:
        raise ImportError(f"estimating {source!r} with --library_name timm needs timm: pip install timm") from None
    config_file = os.path.join(source, "config.json") if os.path.isdir(source) else source
    kwargs: dict[str, Any] = {}
    name = source
    if os.path.isfile(config_file):
        with open(config_file, encoding="utf-8") as file:
            config = json.load(file)
        name = config.get("architecture") or config.get("model_name") or name
        if "num_classes" in config:
            kwargs["num_classes"] = config["num_classes"]
    with init_empty_weights():
        return timm.create_model(name, pretrained=False, **kwargs)


def create_empty_model(model_name: str, library_name: str | None = None, trust_remote_code: bool = False,
                       access_token: str | None = None) -> nn.Module:
    """The model named by ``model_name`` (a folder, a config file or a cached hub name), on the meta device."""
    library = library_name or "transformers"
    if library == "transformers":
        try:
            return _transformers_model(model_name, trust_remote_code)
        except OSError as err:
            raise ValueError(f"cannot find a transformers config for {model_name!r}: give a folder holding "
                             "config.json, the config file itself, or a hub name already in the local cache "
                             f"(nothing is downloaded) ({err})") from None
    if library == "timm":
        return _timm_model(model_name)
    raise ValueError(f"library_name {library_name!r} is not supported; choose 'transformers' or 'timm'")


def estimate_memory(model: nn.Module, dtypes: tuple[str, ...] | list[str] = DTYPES) -> list[MemoryRow]:
    """The table's rows for ``model`` (sizes measured in fp32)."""
    total, (largest, names) = calculate_maximum_sizes(model)
    rows = []
    for dtype in dtypes:
        if dtype not in _DIVISOR:
            raise ValueError(invalid_choice(f"dtype {dtype!r}", dtype, _DIVISOR))
        divisor = _DIVISOR[dtype]
        # Accelerate's estimate: the peak of weights, gradients and the two fp32 Adam moments; fp32 training
        # peaks at the step (4x the weights), mixed precision at the optimizer states (2x); none for int
        training = {"float32": 4 * total, "float16": 2 * total, "bfloat16": 2 * total}.get(dtype)
        rows.append(MemoryRow(dtype, largest / divisor, total / divisor, training, names))
    return rows


def convert_bytes(size: float) -> str:
    """``1536`` -> ``"1.5 KB"`` (Accelerate's rounding and units)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def format_table(model_name: str, rows: list[MemoryRow]) -> str:
    """Accelerate's box-drawn table."""
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    cells = [[r.dtype, convert_bytes(r.largest_layer), convert_bytes(r.total_size),
              "N/A" if r.training_adam is None else convert_bytes(r.training_adam)] for r in rows]
    title = f"Memory Usage for loading `{model_name}`"
    widths = [max(len(headers[i]), *(len(c[i]) for c in cells)) + 2 for i in range(len(headers))]
    inner = sum(widths) + len(widths) - 1
    if len(title) + 2 > inner:
        widths[-1] += len(title) + 2 - inner
        inner = len(title) + 2

    def line(cols: list[str]) -> str:
        return "│" + "│".join(c.center(w) for c, w in zip(cols, widths)) + "│"

    out = ["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", "├" + "┬".join("─" * w for w in widths) + "┤",
           line(headers), "├" + "┼".join("─" * w for w in widths) + "┤"]
    out += [line(c) for c in cells]
    out.append("└" + "┴".join("─" * w for w in widths) + "┘")
    return "\n".join(out)
