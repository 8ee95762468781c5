"""Pipeline parallelism settings: ``PipelineConfig``, the schedule names and the checks on them.

The schedules are ``torch.distributed.pipelining``'s; the names and their rules live here so the
config can check itself without importing the transforms that carry the schedules out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overdrive.config.choices import invalid_choice

SINGLE = ("GPipe", "1F1B")
LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
SCHEDULES = SINGLE + LOOPED + V_SHAPED


def schedule_name(name: str) -> str | None:
    """The canonical spelling of a schedule name given in any case, or None if unknown."""
    return {n.lower(): n for n in SCHEDULES}.get(str(name).lower())


def default_stages_per_rank(name: str) -> int:
    """Stages each rank holds by default under schedule ``name``: 1, or 2 for multi-stage schedules."""
    return 1 if name in SINGLE else 2


def schedule_problems(schedule: Any, num_microbatches: Any, stages_per_rank: Any, pp_size: int) -> list[str]:
    """Every problem with the schedule settings, each naming the value and what to give instead."""
    name = schedule_name(schedule)
    if name is None:
        return [invalid_choice(f"schedule={schedule!r}", schedule, SCHEDULES)]
    problems = []
    spr = default_stages_per_rank(name) if stages_per_rank is None else stages_per_rank
    if not isinstance(spr, int) or isinstance(spr, bool) or spr < 1:
        return [f"stages_per_rank={stages_per_rank!r} is not valid; give an integer >= 1"]
    if name in SINGLE and spr != 1:
        problems.append(f"schedule {name!r} runs one stage per rank, but stages_per_rank={spr}; use "
                        f"stages_per_rank=1 or a multi-stage schedule ({', '.join(LOOPED + V_SHAPED)})")
    if name in V_SHAPED and spr != 2:
        problems.append(f"schedule {name!r} needs exactly 2 stages per rank, got stages_per_rank={spr}")
    num_stages = pp_size * spr
    n = num_stages if num_microbatches is None else num_microbatches
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return [*problems, f"num_microbatches={num_microbatches!r} is not valid; give an integer >= 1"]
    if name == "DualPipeV" and n < num_stages:
        problems.append(f"DualPipeV needs at least as many micro-batches as stages ({num_stages}), got "
                        f"num_microbatches={n}")
    if name in LOOPED:
        rounds = max(1, n // pp_size)
        if n % rounds:
            problems.append(f"{name} with pp_size={pp_size} needs num_microbatches to be a multiple of "
                            f"{rounds} (num_microbatches // pp_size), got {n}; e.g. use {rounds * pp_size}")
    return problems


#: how the default split balances stages: by block count or by parameter count
BALANCE_CHOICES = ("layers", "params")


@dataclass
class PipelineConfig:
    """Pipeline parallelism: how the model is cut into stages and how the micro-batches flow.

    - ``schedule``: ``"GPipe"``, ``"1F1B"`` (one stage per rank), ``"Interleaved1F1B"``, ``"LoopedBFS"``,
      ``"InterleavedZeroBubble"`` (several stages per rank), ``"ZBVZeroBubble"``, ``"DualPipeV"`` (two
      stages per rank, V-shaped) - ``torch.distributed.pipelining``'s schedules.
    - ``num_microbatches``: how many micro-batches each batch is split into (default: the number of
      stages); the per-process batch size must be a multiple of it.
    - ``stages_per_rank``: stages each pipeline rank holds (default 1, or 2 for multi-stage schedules).
    - ``split_points``: names of the blocks where stages 1, 2, ... begin (``["model.layers.4"]``); by
      default the model's list of repeated blocks is cut evenly by ``balance``: ``"layers"`` (block
      count) or ``"params"`` (parameter count, counting the embedding and the head).
    - ``loss_fn``: ``loss_fn(logits, labels)``, run on the last stage per micro-batch (mean reduction).
      Without it the model's own loss is used (a ``transformers`` model given ``labels``).

    The loop changes in one place: the target goes into the model call, as ``labels=``, and the loss
    comes back as ``outputs.loss`` (already back-propagated; ``accelerator.backward(loss)`` is a no-op)::

        outputs = model(ids, labels=targets)
        accelerator.backward(outputs.loss)
    """

    schedule: str = "1F1B"
    num_microbatches: int | None = None
    stages_per_rank: int | None = None
    split_points: list[str] | None = None
    balance: str = "layers"
    loss_fn: Callable | None = None

    def problems(self, pp_size: int) -> list[str]:
        """Every invalid field for ``pp_size`` pipeline ranks, each naming the value and the valid choices."""
        found = schedule_problems(self.schedule, self.num_microbatches, self.stages_per_rank, pp_size)
        if self.balance not in BALANCE_CHOICES:
            found.append(invalid_choice(f"balance={self.balance!r}", self.balance, BALANCE_CHOICES))
        if self.loss_fn is not None and not callable(self.loss_fn):
            found.append(f"loss_fn={self.loss_fn!r} is not callable; give loss_fn(logits, labels) -> loss")
        if self.split_points is not None and (isinstance(self.split_points, str) or not all(
                isinstance(p, str) for p in self.split_points)):
            found.append(f"split_points={self.split_points!r} must be a list of module names")
        return found


