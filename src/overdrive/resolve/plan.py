"""The frozen plans the resolver produces: ``TrainingPlan`` and each strategy's own typed settings.

Plain values: a plan is built once by ``resolve_training`` and only read afterwards; what changes while
training (the checkpoint iteration, ``even_batches``, the selected DeepSpeed plugin) lives in the
Accelerator's runtime state.
"""

from __future__ import annotations

from collections.abc import Callable
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
from overdrive.config._frozen import FrozenValue
from overdrive.precision import PrecisionPolicy
from overdrive.runtime.mesh import ParallelDims
from overdrive.transforms.settings import ModelTransforms

if TYPE_CHECKING:
    from overdrive.config import AORecipeKwargs, InitProcessGroupKwargs, TERecipeKwargs
    from overdrive.strategies.deepspeed import DeepSpeedSettings


# -- each strategy's own settings, typed: a misspelt setting is a TypeError, not silently dropped -----------
# (written out rather than as frozen dataclasses: they are built at every start-up, see overdrive.config._frozen)
class SingleSettings(FrozenValue):
    """One process: nothing to set."""

    def __init__(self) -> None:
        self._init(locals())


class DDPSettings(FrozenValue):
    """``DistributedDataParallel``'s arguments and communication hook."""

    options: DistributedDataParallelKwargs

    def __init__(self, options: DistributedDataParallelKwargs | None = None) -> None:
        options = DistributedDataParallelKwargs() if options is None else options
        self._init(locals())


class FSDP2Settings(FrozenValue):
    """Sharding (``fully_shard``) settings; precision, compile and checkpointing are the model path's."""

    fsdp: FullyShardedDataParallelPlugin

    def __init__(self, fsdp: FullyShardedDataParallelPlugin | None = None) -> None:
        fsdp = FullyShardedDataParallelPlugin() if fsdp is None else fsdp
        self._init(locals())


class FaultTolerantSettings(FrozenValue):
    """Data parallel across replica groups through torchft (``--ft_lighthouse``): this process's group, the
    number of groups the data is sharded over, the lighthouse, the store of this group (None: the strategy
    starts one: a group of one process not started by torchrun), the time a quorum or a transfer may take,
    and DDP's own options inside the group."""

    lighthouse: str
    replica_group: int
    num_replica_groups: int
    store: tuple[str, int] | None
    timeout_s: float
    options: DistributedDataParallelKwargs

    def __init__(self, lighthouse: str, replica_group: int = 0, num_replica_groups: int = 1,
                 store: tuple[str, int] | None = None, timeout_s: float = 60.0,
                 options: DistributedDataParallelKwargs | None = None) -> None:
        options = DistributedDataParallelKwargs() if options is None else options
        self._init(locals())


#: the settings of a strategy that can wrap a pipeline stage
StageSettings = SingleSettings | DDPSettings | FSDP2Settings


class PipelineStrategySettings(FrozenValue):
    """A resolved pipeline: its schedule, and the strategy (with its settings) that wraps each stage.
    ``sync_module_states``: make each stage equal over the processes holding it, from the first of them;
    ``output_pp_rank``: the pipeline rank holding the last stage, whose outputs count when results are
    gathered."""

    schedule: str
    num_microbatches: int
    stages_per_rank: int
    stage_strategy: str
    stage_settings: StageSettings
    split_points: tuple[str, ...] | None
    balance: str
    loss_fn: Callable[..., Any] | None
    sync_module_states: bool
    output_pp_rank: int

    def __init__(self, schedule: str, num_microbatches: int, stages_per_rank: int, stage_strategy: str,
                 stage_settings: StageSettings, split_points: tuple[str, ...] | None = None, balance: str = "layers",
                 loss_fn: Callable[..., Any] | None = None, sync_module_states: bool = True,
                 output_pp_rank: int = 0) -> None:
        self._init(locals())


if TYPE_CHECKING:  # (DeepSpeed's settings are its strategy's, loaded only for a DeepSpeed run)
    #: the settings of any built-in strategy (``TrainingPlan.strategy_settings``)
    StrategySettings = (SingleSettings | DDPSettings | FSDP2Settings | PipelineStrategySettings | DeepSpeedSettings
                        | FaultTolerantSettings)


class TrainingPlan(FrozenValue):
    """Everything an ``Accelerator`` does differently from plain PyTorch, decided once.

    It holds copies of the user's configuration objects; what changes while training (the project's
    checkpoint iteration, the data loaders' ``even_batches``) is the Accelerator's runtime state."""

    strategy: str
    precision: PrecisionPolicy
    #: the accumulation settings (a copy, with ``num_steps`` resolved)
    accumulation: GradientAccumulationPlugin
    dataloader: DataLoaderConfiguration
    device_placement: bool
    step_scheduler_with_optimizer: bool
    rng_types: tuple[str, ...]
    ddp: DistributedDataParallelKwargs
    scaler: GradScalerKwargs
    autocast: AutocastKwargs
    profile: ProfileKwargs | None
    project: ProjectConfiguration
    log_with: tuple[Any, ...]
    #: the strategy's own typed settings (``SingleSettings``, ``DDPSettings``, ``FSDP2Settings``,
    #: ``PipelineStrategySettings`` or DeepSpeed's ``DeepSpeedSettings``)
    strategy_settings: StrategySettings
    #: the model path every strategy runs: tensor parallel, activation checkpointing, compile, precision
    transforms: ModelTransforms
    #: how the processes divide the work (plain DDP: dp_replicate = every process)
    dims: ParallelDims
    #: whether the job asked for a device mesh (a parallelism config, FSDP or tensor parallel)
    uses_mesh: bool
    cp_comm_strategy: str
    #: with DeepSpeed: the plugins and the settings that fill their "auto" values
    deepspeed: DeepSpeedSettings | None
    #: with mixed_precision="fp8": the recipe (``AORecipeKwargs`` / ``TERecipeKwargs``, defaults filled in)
    fp8: AORecipeKwargs | TERecipeKwargs | None
    #: the FSDP plugin given (a copy), or None: what ``AcceleratorState.fsdp_plugin`` reports
    fsdp: FullyShardedDataParallelPlugin | None
    #: the ``InitProcessGroupKwargs`` given, or None: what ``Accelerator.init_handler`` reports
    init_kwargs: InitProcessGroupKwargs | None

    def __init__(self, strategy: str, precision: PrecisionPolicy, accumulation: GradientAccumulationPlugin,
                 dataloader: DataLoaderConfiguration, device_placement: bool = True,
                 step_scheduler_with_optimizer: bool = True, rng_types: tuple[str, ...] = (),
                 ddp: DistributedDataParallelKwargs | None = None, scaler: GradScalerKwargs | None = None,
                 autocast: AutocastKwargs | None = None, profile: ProfileKwargs | None = None,
                 project: ProjectConfiguration | None = None, log_with: tuple[Any, ...] = (),
                 strategy_settings: StrategySettings | None = None, transforms: ModelTransforms | None = None,
                 dims: ParallelDims | None = None, uses_mesh: bool = False, cp_comm_strategy: str = "allgather",
                 deepspeed: DeepSpeedSettings | None = None, fp8: AORecipeKwargs | TERecipeKwargs | None = None,
                 fsdp: FullyShardedDataParallelPlugin | None = None,
                 init_kwargs: InitProcessGroupKwargs | None = None) -> None:
        ddp = DistributedDataParallelKwargs() if ddp is None else ddp
        scaler = GradScalerKwargs() if scaler is None else scaler
        autocast = AutocastKwargs() if autocast is None else autocast
        project = ProjectConfiguration() if project is None else project
        strategy_settings = SingleSettings() if strategy_settings is None else strategy_settings
        transforms = ModelTransforms() if transforms is None else transforms
        dims = ParallelDims() if dims is None else dims
        self._init(locals())

    @property
    def dynamo_backend(self) -> str | None:
        """The ``torch.compile`` backend, or None without compilation."""
        return self.transforms.compile.backend if self.transforms.compile is not None else None

    @property
    def output_pp_rank(self) -> int:
        """The pipeline rank whose outputs count (the last one, or rank 0 for V-shaped schedules)."""
        settings = self.strategy_settings
        return settings.output_pp_rank if isinstance(settings, PipelineStrategySettings) else self.dims.pp - 1
