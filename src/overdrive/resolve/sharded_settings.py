"""The settings of the strategies that shard or cut the model (FSDP2, the pipeline), loaded when the
resolver chooses one (not at every start)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overdrive.config import FullyShardedDataParallelPlugin


@dataclass(frozen=True, slots=True)
class FSDP2Settings:
    """Sharding (``fully_shard``) settings; precision, compile and checkpointing are the model path's."""

    fsdp: FullyShardedDataParallelPlugin = field(default_factory=FullyShardedDataParallelPlugin)


if TYPE_CHECKING:
    from overdrive.resolve.plan import DDPSettings, SingleSettings

    #: the settings of a strategy that can wrap a pipeline stage
    StageSettings = SingleSettings | DDPSettings | FSDP2Settings


@dataclass(frozen=True, slots=True)
class PipelineStrategySettings:
    """A resolved pipeline: its schedule, and the strategy (with its settings) that wraps each stage.
    ``sync_module_states``: make each stage equal over the processes holding it, from the first of them;
    ``output_pp_rank``: the pipeline rank holding the last stage, whose outputs count when results are
    gathered."""

    schedule: str
    num_microbatches: int
    stages_per_rank: int
    stage_strategy: str
    stage_settings: StageSettings
    split_points: tuple[str, ...] | None = None
    balance: str = "layers"
    loss_fn: Callable[..., Any] | None = None
    sync_module_states: bool = True
    output_pp_rank: int = 0
