"""The frozen plans the resolver produces: ``TrainingPlan`` and the settings of the strategies every start may
choose (one process, DDP); FSDP2's and the pipeline's are in ``sharded_settings``, fault tolerance's in
``fault_tolerance``, DeepSpeed's in its strategy: each loads when chosen.

Plain values: a plan is built once by ``resolve_training`` and only read afterwards; what changes while
training (the checkpoint iteration, ``even_batches``, the selected DeepSpeed plugin) lives in the
Accelerator's runtime state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overdrive.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from overdrive.precision import PrecisionPolicy
from overdrive.runtime.mesh import ParallelDims
from overdrive.transforms.settings import ModelTransforms

if TYPE_CHECKING:
    from overdrive.config import (
        AORecipeKwargs,
        FullyShardedDataParallelPlugin,
        InitProcessGroupKwargs,
        TERecipeKwargs,
    )
    from overdrive.resolve.fault_tolerance import FaultTolerantSettings
    from overdrive.resolve.sharded_settings import FSDP2Settings, PipelineStrategySettings
    from overdrive.strategies.deepspeed import DeepSpeedSettings


# -- each strategy's own settings, typed: a misspelt setting is a TypeError, not silently dropped -----------
@dataclass(frozen=True, slots=True)
class SingleSettings:
    """One process: nothing to set."""


@dataclass(frozen=True, slots=True)
class DDPSettings:
    """``DistributedDataParallel``'s arguments and communication hook."""

    options: DistributedDataParallelKwargs = field(default_factory=DistributedDataParallelKwargs)


if TYPE_CHECKING:  # (the other strategies' settings load with their resolver step, when one is chosen)
    #: the settings of any built-in strategy (``TrainingPlan.strategy_settings``)
    StrategySettings = (SingleSettings | DDPSettings | FSDP2Settings | PipelineStrategySettings | DeepSpeedSettings
                        | FaultTolerantSettings)


@dataclass(frozen=True, slots=True, eq=False)
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
        if self.strategy == "pipeline":
            # lazy: measured import time (bench/startup_instructions.py): loaded when a pipeline is chosen
            from overdrive.resolve.sharded_settings import PipelineStrategySettings

            assert isinstance(settings, PipelineStrategySettings)
            return settings.output_pp_rank
        return self.dims.pp - 1
