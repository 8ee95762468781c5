"""Pipeline schedules by name: which stages a rank holds, the checks on the settings, and the idle share
("bubble") of a schedule computed from its action list.

The schedules are ``torch.distributed.pipelining``'s. Two families:

- one stage per rank: ``GPipe``, ``1F1B``;
- several stages per rank: looped (stage ``s`` on rank ``s % pp``) ``Interleaved1F1B``, ``LoopedBFS``,
  ``InterleavedZeroBubble``; V-shaped (rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``, so the first
  and last stage share rank 0) ``ZBVZeroBubble``, ``DualPipeV``, which need exactly two stages per rank.
"""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overdrive.config.pipeline import (  # noqa: F401 - re-exported: the schedule names live with the config
    LOOPED,
    SCHEDULES,
    SINGLE,
    V_SHAPED,
    default_stages_per_rank,
    schedule_name,
    schedule_problems,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from overdrive.transforms.pipeline.split import StageLayout

def stage_style(name: str) -> str:
    """How schedule ``name`` places stages on ranks: ``"v"`` (V-shaped) or ``"loop"``."""
    return "v" if name in V_SHAPED else "loop"


def stage_to_rank(num_ranks: int, num_stages: int, style: str) -> dict[int, int]:
    """Stage index -> pipeline rank holding it ("loop": round robin; "v": down then back up)."""
    if style == "loop":
        return {s: s % num_ranks for s in range(num_stages)}
    mapping, rank = {}, 0
    for s in range(num_stages):
        mapping[s] = rank
        if (s + 1) % num_ranks:
            rank += 1 if (s // num_ranks) % 2 == 0 else -1
    return mapping


def local_stages(rank: int, num_ranks: int, stages_per_rank: int, style: str) -> list[int]:
    """The stage indices pipeline rank ``rank`` holds, in increasing order."""
    mapping = stage_to_rank(num_ranks, num_ranks * stages_per_rank, style)
    return sorted(s for s, r in mapping.items() if r == rank)


#: time units of each kind of compute action in ``bubble_fraction`` (a full backward is input + weight)
COSTS = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


def bubble_fraction(pipeline_order: dict[int, list[Any]], costs: dict[str, float] | None = None) -> dict[int, float]:
    """Per rank, the share of the step in which the rank computes nothing, computed from the schedule's
    action list (``schedule.pipeline_order``): each rank runs its compute actions in order, each as soon as
    the micro-batch's activations (forward) or gradients (backward) it needs are done, with the ``costs``
    of ``COSTS`` and free communication."""
    costs = costs or COSTS
    queues = {rank: [leaf for a in actions if a is not None for leaf in _leaves(a)]
              for rank, actions in pipeline_order.items()}
    last = max((a.stage_index for q in queues.values() for a in q), default=0)
    finished: dict[tuple[str, int, int], float] = {}
    clock = dict.fromkeys(queues, 0.0)
    busy = dict.fromkeys(queues, 0.0)
    position = dict.fromkeys(queues, 0)
    while any(position[r] < len(q) for r, q in queues.items()):
        moved = False
        for rank, queue in queues.items():
            while position[rank] < len(queue):
                action = queue[position[rank]]
                kind, stage, mb = _kind(action), action.stage_index, action.microbatch_index
                needs = _needs(kind, stage, mb, last)
                if any(n not in finished for n in needs):
                    break
                start = max([clock[rank], *(finished[n] for n in needs)])
                clock[rank] = start + costs[kind]
                busy[rank] += costs[kind]
                finished[("G" if kind in "BI" else kind, stage, mb)] = clock[rank]
                position[rank] += 1
                moved = True
        if not moved:
            raise ValueError("the action list cannot run: an action waits for one that never comes")
    span = max(clock.values(), default=0.0)
    return {rank: (1.0 - busy[rank] / span) if span else 0.0 for rank in queues}


def one_f_one_b_order(num_ranks: int, num_microbatches: int) -> dict[int, list[Any]]:
    """The 1F1B action list (warm-up forwards, alternating forward and backward, cool-down backwards).
    torch's own list for 1F1B (``pipeline_order``, drawn for visualisation) skips the first forward of the
    last rank, so it cannot be simulated; this is the order the schedule runs."""
    step = namedtuple("step", "stage_index computation_type microbatch_index")
    order = {}
    for rank in range(num_ranks):
        warmup = min(num_ranks - 1 - rank, num_microbatches)
        actions = [step(rank, "F", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [step(rank, "F", warmup + i), step(rank, "B", i)]
        actions += [step(rank, "B", i) for i in range(num_microbatches - warmup, num_microbatches)]
        order[rank] = actions
    return order


def _kind(action: Any) -> str:
    return str(getattr(action.computation_type, "value", action.computation_type))


def _leaves(action: Any) -> list[Any]:
    """The compute actions of one entry (an overlapped forward-backward holds two)."""
    if getattr(action, "sub_actions", None):
        return [leaf for sub in action.sub_actions for leaf in _leaves(sub)]
    return [action] if _kind(action) in COSTS else []


def _needs(kind: str, stage: int, mb: int, last: int) -> list[tuple[str, int, int]]:
    """What an action waits for: forward needs the previous stage's forward; a backward (full or input)
    needs its own forward and the next stage's input gradient; a weight backward its input backward."""
    if kind == "F":
        return [("F", stage - 1, mb)] if stage else []
    if kind == "W":
        return [("G", stage, mb)]
    return [("F", stage, mb)] + ([("G", stage + 1, mb)] if stage < last else [])


@dataclass
class PipelineRuntime:
    """What a pipelined model runs with: its schedule, its place in the pipeline, its process group and
    the strategy's hooks. Runtime state, not user settings (those are ``PipelineConfig``): ``apply_pipeline``
    fills in ``layout`` and ``ties`` as it cuts the model."""

    schedule: str
    num_microbatches: int
    stages_per_rank: int
    device: torch.device
    pp_size: int = 1
    pp_rank: int = 0
    pp_group: Any = None
    split_points: list[str] | None = None
    balance: str = "layers"
    loss_fn: Callable[..., torch.Tensor] | None = None
    #: the Accelerator's AccumulationWindow: the loss is divided by its ``divisor``, as accelerator.backward
    #: would (None: no accumulation)
    window: Any = None
    #: whether this process writes its stage's weights for ``save_model`` (the first of its data-parallel peers)
    speaks_for_stage: bool = True
    max_cached_shapes: int = 4
    #: the stage strategy's ``no_sync(wrapped_stage)``: a step runs inside it, because torch's schedules
    #: reduce gradients themselves at the last micro-batch (and DDP must not expect a backward from the
    #: metadata pass of a schedule's first step)
    no_sync: Callable[[nn.Module], Any] = field(default=lambda module: contextlib.nullcontext())
    layout: StageLayout | None = None
    #: the job's ParallelMesh (tied weights make their process groups from it)
    mesh: Any = None
    ties: list[Any] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        """Stages in the whole pipeline: ranks x stages per rank."""
        return self.pp_size * self.stages_per_rank

    @property
    def style(self) -> str:
        """How stages map to ranks: ``"loop"`` or ``"v"``."""
        return stage_style(self.schedule)

    @property
    def local_stages(self) -> list[int]:
        """The stage indices this rank holds."""
        return local_stages(self.pp_rank, self.pp_size, self.stages_per_rank, self.style)

    @property
    def last_stage_rank(self) -> int:
        """The pipeline rank holding the last stage (rank 0 for V-shaped schedules)."""
        return stage_to_rank(self.pp_size, self.num_stages, self.style)[self.num_stages - 1]
