"""Inference with a model split over processes: ``prepare_pippy`` (Accelerate's name) on overdrive's
pipeline transform (:func:`overdrive.transforms.pipeline.apply_pipeline`).

Every process builds (or loads) the whole model; each keeps one stage of it: a contiguous run of its
blocks (the model's ``ModuleList`` of layers) chosen evenly, or cut before the modules named in
``split_points``. A forward called on every process with the same batch runs GPipe over ``num_chunks``
micro-batches and returns the output on the last process (``None`` elsewhere), or on every process with
``gather_output=True``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from overdrive.big_model.estimate import convert_bytes
from overdrive.big_model.planning import infer_auto_device_map
from overdrive.big_model.sizes import calculate_maximum_sizes
from overdrive.runtime import group as process_group
from overdrive.runtime.mesh import ParallelDims, ParallelMesh
from overdrive.runtime.torch_private import tree_flatten, tree_map
from overdrive.training.state import PartialState
from overdrive.transforms.pipeline.model import apply_pipeline
from overdrive.transforms.pipeline.schedule import PipelineRuntime

__all__ = ["prepare_pippy", "PippyOutput", "find_pippy_batch_size", "generate_device_map"]


class PippyOutput(tuple):
    """A transformers model's pipelined output: ``output[0]`` and ``output.logits`` are the logits."""

    @property
    def logits(self) -> torch.Tensor:
        """The logits (the first element), under the attribute name transformers' outputs use."""
        return self[0]


class PippyModel(nn.Module):
    """The model as one process of the pipeline sees it; call it on every process with the same inputs."""

    def __init__(self, model: nn.Module, pipelined: Any, num_chunks: int, gather_output: bool, last_rank: int,
                 group: Any) -> None:
        super().__init__()
        self.pipelined = pipelined  # None with one process: the model runs whole
        self.num_chunks, self.gather_output, self.last_rank, self.group = num_chunks, gather_output, last_rank, group
        layout = pipelined.settings.layout if pipelined is not None else None
        #: the first block of every stage after the first (Accelerate's attribute)
        self.hf_split_points = [layout.block_names[start] for start, _ in layout.bounds[1:]] if layout else []
        self.__dict__["original"] = model  # not a child: the stage shares its modules
        self._transformers = hasattr(model, "config") and hasattr(model, "can_generate")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.pipelined is None:
            with torch.no_grad():
                output = self.__dict__["original"](*args, **kwargs)
            logits = output.logits if hasattr(output, "logits") else output
            return PippyOutput((logits,)) if self._transformers else logits
        args, kwargs, batch = _pad_batch(args, kwargs, self.num_chunks)
        with torch.no_grad():
            logits = self.pipelined(*args, **kwargs).logits
        rank = process_group.rank(self.group) if self.group is not None else 0
        if self.gather_output and self.group is not None:
            logits = _broadcast_from(logits, self.last_rank, self.group)
        elif rank != self.last_rank:
            return None
        logits = logits[:batch]
        return PippyOutput((logits,)) if self._transformers else logits


def find_pippy_batch_size(args: tuple, kwargs: dict) -> int | None:
    """The batch size of the first tensor among ``args`` then ``kwargs``' values (None if there is none)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim:
            return int(value.shape[0])
    return None


def generate_device_map(model: nn.Module, num_processes: int = 1, no_split_module_classes: list[str] | None = None,
                        max_memory: dict | None = None) -> dict[str, Any]:
    """Accelerate's even split of ``model`` over ``num_processes`` devices (a device map, not cleaned):
    each gets (model size + largest layer) / n, plus 10%."""
    if num_processes == 1:
        return infer_auto_device_map(model, max_memory, no_split_module_classes, clean_result=False)
    if max_memory is None:
        total, (largest, _) = calculate_maximum_sizes(model)
        value, unit = convert_bytes((total + largest) / num_processes).split(" ")
        max_memory = dict.fromkeys(range(num_processes), f"{math.ceil(float(value)) * 1.1} {unit}")
    return infer_auto_device_map(model, max_memory, no_split_module_classes, clean_result=False)


def _batch_of(tree: Any) -> int | None:
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.ndim:
            return leaf.shape[0]
    return None


def _pad_batch(args: tuple, kwargs: dict, num_chunks: int) -> tuple[tuple, dict, int]:
    """Repeat the last sample until the batch splits into ``num_chunks`` equal micro-batches."""
    batch = _batch_of((args, kwargs))
    if batch is None:
        raise ValueError("prepare_pippy's model needs a tensor input with a batch dimension to split into chunks")
    extra = -batch % num_chunks
    if not extra:
        return args, kwargs, batch

    def pad(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.ndim and t.shape[0] == batch:
            return torch.cat([t, t[-1:].expand(extra, *t.shape[1:])])
        return t

    return tree_map(pad, args), tree_map(pad, kwargs), batch


def _broadcast_from(tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    shape = torch.tensor(list(tensor.shape) + [0] * (8 - tensor.ndim), dtype=torch.long)
    dist.broadcast(shape, group=group, group_src=src)
    full = tensor if process_group.rank(group) == src else torch.empty([int(s) for s in shape[:tensor.ndim]],
                                                                  dtype=tensor.dtype, device=tensor.device)
    dist.broadcast(full, group=group, group_src=src)
    return full


def prepare_pippy(model: nn.Module, split_points: str | list[str] | None = "auto",
                  no_split_module_classes: list[str] | None = None, example_args: tuple = (),
                  example_kwargs: dict | None = None, num_chunks: int | None = None,
                  gather_output: bool = False) -> nn.Module:
    """Split ``model`` over all processes (one stage each) for inference; returns the model to call.

    Args:
        split_points: ``"auto"`` (even runs of blocks) or the names of the blocks each later stage starts at
            (``["model.layers.2"]`` for two stages).
        num_chunks: micro-batches per forward (default: the number of processes); the batch is padded up to
            a multiple of it and the output cut back.
        gather_output: give the output to every process (default: only the last one; others get ``None``).
        no_split_module_classes, example_args, example_kwargs: accepted for Accelerate compatibility; blocks
            are never split here and no tracing is needed.

    Example:
        >>> model = prepare_pippy(model, gather_output=True)
        >>> logits = model(input_ids)      # on every process, with the same input_ids
    """
    state = PartialState()
    world, rank, device = state.num_processes, state.process_index, state.device
    model.eval()
    if world == 1:  # nothing to split: Accelerate runs the model as it is too
        return PippyModel(model, None, 1, gather_output, 0, None)
    group = dist.group.WORLD
    points = None if split_points in (None, "auto") else list(split_points)
    settings = PipelineRuntime(schedule="GPipe", num_microbatches=num_chunks or world, stages_per_rank=1,
                                device=device, pp_size=world, pp_rank=rank, pp_group=group, split_points=points,
                                mesh=ParallelMesh(ParallelDims(pp=world), device.type, global_rank=rank))
    pipelined = apply_pipeline(model, settings, lambda stage: stage.to(device))
    pipelined.eval()
    return PippyModel(model, pipelined, settings.num_microbatches, gather_output, settings.last_stage_rank, group)
