"""Tied weights across pipeline stages (an output head sharing the input embedding's matrix).

Each stage that uses a tied parameter holds it, under every name the whole model gives it (so checkpoints
and optimizer state read the same at any number of stages). After each schedule step the gradient each
holder added in that step is summed over the holders, so every copy sees the whole model's gradient,
steps identically, and stays equal; the global gradient norm counts the parameter once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from overdrive.runtime import group as process_group
from overdrive.transforms.pipeline.schedule import stage_to_rank
from overdrive.transforms.pipeline.split import SplitError, StageLayout, stage_of


@dataclass
class TiedParameter:
    """One parameter used by several stages: its names in the whole model and the stages using it."""

    names: tuple[str, ...]
    stages: tuple[int, ...]
    #: the pipeline ranks holding it, and (on those ranks) the group over which they sum gradients
    ranks: tuple[int, ...] = ()
    group: Any = None
    counting_rank: int = 0


def find_tied_parameters(model: nn.Module, layout: StageLayout) -> list[TiedParameter]:
    """The parameters of ``model`` that more than one stage of ``layout`` uses."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    tied = []
    for group in names.values():
        stages = tuple(sorted({stage_of(n, layout) for n in group}))
        if len(stages) > 1:
            tied.append(TiedParameter(tuple(group), stages))
    return tied


def place_ties(tied: list[TiedParameter], pp_size: int, style: str, num_stages: int, mesh: Any) -> None:
    """Find the ranks holding each tied parameter and make the process group that sums its gradients (a
    collective: every process calls it with the same ties)."""
    mapping = stage_to_rank(pp_size, num_stages, style)
    for tie in tied:
        tie.ranks = tuple(sorted({mapping[s] for s in tie.stages}))
        tie.counting_rank = mapping[tie.stages[0]]
        if len(tie.ranks) < len(tie.stages):
            raise SplitError(
                f"{' and '.join(tie.names)} are one parameter used by stages {list(tie.stages)}, which the schedule "
                "puts on the same rank (a V-shaped schedule holds the first and the last stage together); untie "
                "them (e.g. tie_word_embeddings=False) or use a looped schedule")
        tie.group = _group(tie.ranks, pp_size, mesh)


def _group(ranks: tuple[int, ...], pp_size: int, mesh: Any) -> Any:
    pp = mesh.get("pp")
    if len(ranks) == pp_size:
        return pp.get_group()
    # One group per position along the other axes; every process creates all of them, in the same order.
    layout = mesh.mesh.mesh.reshape(pp_size, -1)
    mine = None
    for column in range(layout.shape[1]):
        members = [int(layout[r, column]) for r in ranks]
        new = dist.new_group(members)
        if process_group.rank() in members:
            mine = new
    return mine


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


@contextmanager
def summed_tied_gradients(model: nn.Module, tied: list[TiedParameter], pp_rank: int) -> Iterator[None]:
    """Around one schedule step: afterwards, add up over the holders what each added to the gradients of
    the tied parameters during the step."""
    mine = [(tie, model.get_parameter(_local_name(model, tie))) for tie in tied if pp_rank in tie.ranks]
    before = [p.grad.detach().clone() if p.grad is not None else None for _, p in mine]
    yield
    for (tie, param), old in zip(mine, before):
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        added = _local(grad).detach().clone()
        if old is not None:
            added -= _local(old)
        dist.all_reduce(added, group=tie.group)
        if old is not None:
            added += _local(old)
        _local(grad).copy_(added)
        param.grad = grad


def _local_name(model: nn.Module, tie: TiedParameter) -> str:
    present = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return next(n for n in tie.names if n in present)


def counted_elsewhere(model: nn.Module, tied: list[TiedParameter], pp_rank: int) -> set[int]:
    """Ids of this rank's copies of tied parameters that the global norm must not count again (it counts
    the copy of the rank holding the lowest of their stages)."""
    return {id(model.get_parameter(_local_name(model, tie))) for tie in tied
            if pp_rank in tie.ranks and pp_rank != tie.counting_rank}


def broadcast_stage(stage: nn.Module, group: Any, tied: list[TiedParameter]) -> None:
    """Make a stage's weights those of the first process holding the stage (``group``: the processes
    holding it), and its tied weights those of the rank holding the lowest of their stages (collectives)."""
    with torch.no_grad():
        if group is not None:
            for tensor in [*stage.parameters(), *stage.buffers()]:
                dist.broadcast(tensor.data, group=group, group_src=0)
        names = {n for n, _ in stage.named_parameters(remove_duplicate=False)}
        for tie in tied:
            present = [n for n in tie.names if n in names]
            if present and tie.group is not None:
                source = tie.ranks.index(tie.counting_rank)
                dist.broadcast(stage.get_parameter(present[0]).data, group=tie.group, group_src=source)
