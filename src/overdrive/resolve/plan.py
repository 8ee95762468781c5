"""The frozen plans the resolver produces: ``TrainingPlan`` and each strategy's own typed settings.

Plain values: a plan is built once by ``resolve_training`` and only read afterwards; what changes while
training (the checkpoint iteration, ``even_batches``, the selected DeepSpeed plugin) lives in the
Accelerator's runtime state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overdrive.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from overdrive.precision import PrecisionPolicy
from overdrive.runtime.mesh import ParallelDims
from overdrive.transforms.settings import ModelTransforms

if TYPE_CHECKING:
    from overdrive.config import AORecipeKwargs, InitProcessGroupKwargs, TERecipeKwargs
    from overdrive.strategies.deepspeed import DeepSpeedSettings


# -- each strategy's own settings, typed: a misspelt setting is a TypeError, not silently dropped -----------
@dataclass(frozen=True, slots=True)
class SingleSettings:
    """One process: nothing to set."""


@dataclass(frozen=True, slots=True)
class DDPSettings:
    """``DistributedDataParallel``'s arguments and communication hook."""

    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)


@dataclass(frozen=True, slots=True)
class FSDP2Settings:
    """Sharding (``fully_shard``) settings; precision, compile and checkpointing are the model path's."""

    fsdp: FullyShardedDataParallelPlugin = field(default_factory=FullyShardedDataParallelPlugin)


@dataclass(frozen=True, slots=True)
class FaultTolerantSettings:
    """Data parallel across replica groups through torchft (``--ft_lighthouse``): this process's group, the
    number of groups the data is sharded over, the lighthouse, the store of this group (None: the strategy
    starts one: a group of one process not started by torchrun), the time a quorum or a transfer may take,
    and the data parallel inside the group: DDP's options, or FSDP2's plugin."""

    lighthouse: str
    replica_group: int = 0
    num_replica_groups: int = 1
    store: tuple[str, int] | None = None
    timeout_s: float = 60.0
    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    #: FSDP2's settings when each group shards the model over its processes (``ft_fsdp2``); None: DDP inside
    fsdp: FullyShardedDataParallelPlugin | None = None


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


if TYPE_CHECKING:  # (DeepSpeed's settings are its strategy's, loaded only for a DeepSpeed run)
    #: the settings of any built-in strategy (``TrainingPlan.strategy_settings``)
    StrategySettings = (SingleSettings | DDPSettings | FSDP2Settings | PipelineStrategySettings | DeepSpeedSettings
                        | FaultTolerantSettings)


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """Everything an ``Accelerator`` does differently from plain PyTorch, decided once.

    It holds copies of the user's configuration objects; what changes while training (the project's
    checkpoint iteration, the data loaders' ``even_batches``) is the Accelerator's runtime state."""

    strategy: str
    precision: PrecisionPolicy
    #: the accumulation settings (a copy, with ``num_steps`` resolved)
    accumulation: GradientAccumulationPlugin
    dataloader: DataLoaderConfiguration
    device_placement: bool = True
    step_scheduler_with_optimizer: bool = True
    rng_types: tuple[str, ...] = ()
    ddp: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)
    scaler: GradScalerKwargs = field(default_factory=GradScalerKwargs)
    autocast: AutocastKwargs = field(default_factory=AutocastKwargs)
    profile: ProfileKwargs | None = None
    project: ProjectConfiguration = field(default_factory=ProjectConfiguration)
    log_with: tuple[Any, ...] = ()
    #: the strategy's own typed settings (``SingleSettings``, ``DDPSettings``, ``FSDP2Settings``,
    #: ``PipelineStrategySettings`` or DeepSpeed's ``DeepSpeedSettings``)
    strategy_settings: StrategySettings = field(default_factory=SingleSettings)
    #: the model path every strategy runs: tensor parallel, activation checkpointing, compile, precision
    transforms: ModelTransforms = field(default_factory=ModelTransforms)
    #: how the processes divide the work (plain DDP: dp_replicate = every process)
    dims: ParallelDims = field(default_factory=ParallelDims)
    #: whether the job asked for a device mesh (a parallelism config, FSDP or tensor parallel)
    uses_mesh: bool = False
    cp_comm_strategy: str = "allgather"
    #: with DeepSpeed: the plugins and the settings that fill their "auto" values
    deepspeed: DeepSpeedSettings | None = None
    #: with mixed_precision="fp8": the recipe (``AORecipeKwargs`` / ``TERecipeKwargs``, defaults filled in)
    fp8: AORecipeKwargs | TERecipeKwargs | None = None
    #: the FSDP plugin given (a copy), or None: what ``AcceleratorState.fsdp_plugin`` reports
    fsdp: FullyShardedDataParallelPlugin | None = None
    #: the ``InitProcessGroupKwargs`` given, or None: what ``Accelerator.init_handler`` reports
    init_kwargs: InitProcessGroupKwargs | None = None

    @property
    def dynamo_backend(self) -> str | None:
        """The ``torch.compile`` backend, or None without compilation."""
        return self.transforms.compile.backend if self.transforms.compile is not None else None

    @property
    def output_pp_rank(self) -> int:
        """The pipeline rank whose outputs count (the last one, or rank 0 for V-shaped schedules)."""
        settings = self.strategy_settings
        return settings.output_pp_rank if isinstance(settings, PipelineStrategySettings) else self.dims.pp - 1
