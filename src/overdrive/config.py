"""User-facing configuration: plugins, kwargs handlers and enums, with Accelerate's names and fields.

These are plain values. They never read the environment and never act; ``overdrive.resolve`` turns
them, the launch config and the environment into one frozen plan.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return self.value


class DistributedType(_StrEnum):
    """How a run is parallel, as Accelerate reports it. Descriptive only: nothing dispatches on it."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(_StrEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


class RNGType(_StrEnum):
    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    NPU = "npu"
    MLU = "mlu"
    MUSA = "musa"
    HPU = "hpu"
    XPU = "xpu"
    GENERATOR = "generator"


class LoggerType(_StrEnum):
    ALL = "all"
    JSONL = "jsonl"
    CSV = "csv"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"


class DDPCommunicationHookType(_StrEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class KwargsHandler:
    """Base of the ``*Kwargs`` dataclasses: ``to_kwargs()`` gives the fields that differ from defaults."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__().to_dict()  # type: ignore[call-arg]
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel``, and its communication hook."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: Literal[DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16,
                          DDPCommunicationHookType.BF16] | str = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = _choice(DDPCommunicationHookType, self.comm_hook, "comm_hook")
        self.comm_wrapper = _choice(DDPCommunicationHookType, self.comm_wrapper, "comm_wrapper")

    def ddp_kwargs(self) -> dict[str, Any]:
        """The fields that ``DistributedDataParallel`` itself takes."""
        skip = {"comm_hook", "comm_wrapper", "comm_state_option"}
        return {k: v for k, v in self.to_kwargs().items() if k not in skip}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for ``torch.amp.GradScaler`` (fp16 loss scaling)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``. ``backend=None`` picks the device's own."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``torch.autocast`` around the prepared models' forward."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for ``torch.profiler.profile`` used by ``Accelerator.profile``."""

    activities: list[Literal["cpu", "xpu", "mtia", "cuda", "hpu"]] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None


@dataclass
class DataLoaderConfiguration:
    """How prepared data loaders shard, order and move batches.

    - ``split_batches``: the loader's batch is the global batch and is split across processes
      (its size must divide by the number of processes); otherwise each process gets a whole batch.
    - ``dispatch_batches``: rank 0 reads every batch and sends each process its part (default: on for
      iterable datasets).
    - ``even_batches``: every process gets the same number of batches, wrapping around to the start of
      the data to fill the last one; ``gather_for_metrics`` drops those duplicates.
    - ``use_seedable_sampler``: shuffle from ``data_seed`` (default: the seed in force) and the epoch, so
      the global order is the same at any world size.
    - ``non_blocking``: copy batches to the device asynchronously (with pinned memory).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation: sync and step every ``num_steps`` batches (and at the end of the loader)."""

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclass
class ProjectConfiguration:
    """Where a run writes its checkpoints and logs, and how checkpoints are named and kept."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclass
class TorchTensorParallelPlugin:
    """Tensor parallelism (``torch.distributed.tensor.parallel``) over ``tp_size`` processes.

    ``tp_plan`` maps module-name patterns (``*`` stands for one name component, e.g. ``"layers.*.mlp.up"``)
    to a style: ``"colwise"``, ``"rowwise"``, ``"colwise_rep"`` (colwise, output gathered),
    ``"sequence_parallel"`` or ``"replicate"``. Without a plan the transformer blocks are recognised by
    their structure (attention q/k/v/o and MLP up/gate/down). ``sequence_parallel`` also shards the norms
    and dropouts of each block along the sequence dimension. ``torch_device_mesh`` is accepted for
    Accelerate compatibility; overdrive builds the mesh itself from ``ParallelismConfig``.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None
    tp_plan: dict[str, str] | None = None
    sequence_parallel: bool = False


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
        from overdrive.transforms.pipeline_schedule import schedule_problems
        from overdrive.transforms.pipeline_split import BALANCE_CHOICES

        found = schedule_problems(self.schedule, self.num_microbatches, self.stages_per_rank, pp_size)
        if self.balance not in BALANCE_CHOICES:
            found.append(f"balance={self.balance!r} is not valid; choose one of {list(BALANCE_CHOICES)}")
        if self.loss_fn is not None and not callable(self.loss_fn):
            found.append(f"loss_fn={self.loss_fn!r} is not callable; give loss_fn(logits, labels) -> loss")
        if self.split_points is not None and (isinstance(self.split_points, str) or not all(
                isinstance(p, str) for p in self.split_points)):
            found.append(f"split_points={self.split_points!r} must be a list of module names")
        return found


@dataclass
class ParallelismConfig:
    """How the processes of a job divide the work: one device mesh with named axes.

    ``dp_replicate_size`` x ``dp_shard_size`` x ``cp_size`` x ``tp_size`` (x ``pp_size``) must equal the
    number of processes; one of them may be -1 to take what is left. ``dp_shard_size > 1`` shards
    parameters with FSDP2 (with ``dp_replicate_size > 1`` too: HSDP); ``tp_size`` is tensor parallel and
    ``cp_size`` context parallel (sequence split across processes, CUDA only). ``pp_size`` is pipeline
    parallel (the model cut into stages), set up by ``pp_handler``, a ``PipelineConfig``::

        Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
        Accelerator(parallelism_config=ParallelismConfig(pp_size=2, dp_shard_size=2,
                                                         pp_handler=PipelineConfig(schedule="1F1B")))
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    pp_size: int = 1
    #: tensor-parallel settings (plan, sequence parallel); a ``TorchTensorParallelPlugin``.
    tp_handler: TorchTensorParallelPlugin | None = None
    #: context-parallel settings: a dict or object with ``cp_comm_strategy`` ("allgather" or "alltoall").
    cp_handler: Any = None
    #: pipeline settings (schedule, micro-batches, stages per rank, split points, loss function); a
    #: ``PipelineConfig`` (or a dict of its fields). Used when ``pp_size > 1``.
    pp_handler: PipelineConfig | dict | None = None

    def sizes(self) -> dict[str, int]:
        """The axis sizes by mesh axis name."""
        return {"pp": self.pp_size, "dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size,
                "cp": self.cp_size, "tp": self.tp_size}


#: Accelerate's ``fsdp_config`` keys (YAML / launcher) -> FullyShardedDataParallelPlugin fields.
_FSDP_CONFIG_KEYS = {
    "fsdp_version": "fsdp_version",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "fsdp_min_num_params": "min_num_params",
    "fsdp_reshard_after_forward": "reshard_after_forward",
    "fsdp_sharding_strategy": "sharding_strategy",
    "fsdp_offload_params": "cpu_offload",
    "fsdp_state_dict_type": "state_dict_type",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_activation_checkpointing": "activation_checkpointing",
    "fsdp_backward_prefetch": "backward_prefetch",
    "fsdp_backward_prefetch_policy": "backward_prefetch",
    "fsdp_forward_prefetch": "forward_prefetch",
    "fsdp_sync_module_states": "sync_module_states",
    "fsdp_use_orig_params": "use_orig_params",
    "fsdp_limit_all_gathers": "limit_all_gathers",
    "fsdp_ignored_modules": "ignored_modules",
}
_WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
# FSDP1 sharding strategies -> FSDP2 reshard_after_forward (HYBRID_* also need dp_replicate_size > 1).
_SHARDING_STRATEGIES = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True,
                        "_HYBRID_SHARD_ZERO2": False, "HYBRID_SHARD_ZERO2": False}


@dataclass
class FullyShardedDataParallelPlugin:
    """Fully sharded data parallel with Accelerate's fields, carried out by FSDP2 (``fully_shard``).

    - ``reshard_after_forward``: free the gathered parameters after forward (``True``, as FULL_SHARD) or
      keep them for backward (``False``, as SHARD_GRAD_OP). ``sharding_strategy`` (FSDP1's name) maps here.
    - ``auto_wrap_policy``: which submodules get their own ``fully_shard`` group: ``"transformer_based_wrap"``
      (classes named in ``transformer_cls_names_to_wrap``; default: the model's ``_no_split_modules`` or its
      repeated blocks), ``"size_based_wrap"`` (``min_num_params``), ``"no_wrap"``, or a callable
      ``policy(name, module) -> bool``.
    - ``cpu_offload``: keep sharded parameters, gradients and optimizer state on the CPU.
    - ``mixed_precision_policy``: overrides the policy taken from ``Accelerator(mixed_precision=...)``
      (a ``MixedPrecisionPolicy``, a dict of its fields, or a dtype name such as ``"bf16"``).
    - ``activation_checkpointing``: recompute each wrapped block's activations in backward.
    - ``cpu_ram_efficient_loading``: only rank 0 holds the full weights (others may build the model on
      the meta device); the model is sharded on the meta device and the weights are broadcast from rank 0.
    - ``state_dict_type``: ``"SHARDED_STATE_DICT"`` (each process saves its shards) or ``"FULL_STATE_DICT"``.
    - ``ignored_modules``: modules (or a regex on their names) that FSDP leaves alone.

    ``fsdp_version=1`` is accepted and runs on FSDP2. ``backward_prefetch``, ``forward_prefetch``,
    ``limit_all_gathers`` and ``use_orig_params`` are FSDP1 settings, accepted and not needed by FSDP2.

        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                       transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    """

    fsdp_version: int | None = None
    reshard_after_forward: bool | int | str | None = None
    sharding_strategy: str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable | str | None = None
    cpu_offload: Any = False
    ignored_modules: Any = None
    state_dict_type: str = "SHARDED_STATE_DICT"
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable | None = None
    sync_module_states: bool = True
    forward_prefetch: bool = False
    activation_checkpointing: bool = False
    cpu_ram_efficient_loading: bool = False
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid FullyShardedDataParallelPlugin:\n  - " + "\n  - ".join(problems))
        if self.fsdp_version is not None:
            self.fsdp_version = int(self.fsdp_version)
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [
                name.strip() for name in self.transformer_cls_names_to_wrap.split(",") if name.strip()]
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = self.auto_wrap_policy.lower()
        self.state_dict_type = _state_dict_name(self.state_dict_type)
        if self.min_num_params is not None:
            self.min_num_params = int(self.min_num_params)
        if self.min_num_params and self.auto_wrap_policy is None:
            self.auto_wrap_policy = "size_based_wrap"

    def problems(self) -> list[str]:
        """Every invalid field, each naming the value and the valid choices."""
        found = []
        if self.fsdp_version not in (None, 1, 2, "1", "2"):
            found.append(f"fsdp_version={self.fsdp_version!r} is not valid; choose 1 or 2 (both run on FSDP2)")
        if self.sharding_strategy is not None and _sharding_name(self.sharding_strategy) not in _SHARDING_STRATEGIES:
            found.append(f"sharding_strategy={self.sharding_strategy!r} is not valid; choose one of "
                         f"{sorted(_SHARDING_STRATEGIES)} (NO_SHARD is plain DDP: leave fsdp_plugin out)")
        rsf = self.reshard_after_forward
        if isinstance(rsf, str) and _sharding_name(rsf) not in _SHARDING_STRATEGIES and rsf.lower() not in (
                "true", "false"):
            found.append(f"reshard_after_forward={rsf!r} is not valid; give True, False or an int")
        policy = self.auto_wrap_policy
        if isinstance(policy, str) and policy.lower() not in _WRAP_POLICIES:
            found.append(f"auto_wrap_policy={policy!r} is not valid; choose one of {list(_WRAP_POLICIES)} "
                         "or give a callable policy(name, module) -> bool")
        elif policy is not None and not isinstance(policy, str) and not callable(policy):
            found.append(f"auto_wrap_policy={policy!r} is neither a policy name nor a callable")
        if _state_dict_name(self.state_dict_type) not in _STATE_DICT_TYPES:
            found.append(f"state_dict_type={self.state_dict_type!r} is not valid; choose one of "
                         f"{list(_STATE_DICT_TYPES)}")
        if self.min_num_params is not None and (not str(self.min_num_params).isdigit()):
            found.append(f"min_num_params={self.min_num_params!r} must be a non-negative integer")
        return found

    @property
    def reshard(self) -> bool | int:
        """``reshard_after_forward`` as FSDP2 takes it (True unless asked otherwise)."""
        value = self.reshard_after_forward
        if value is None:
            return _SHARDING_STRATEGIES.get(_sharding_name(self.sharding_strategy or "FULL_SHARD"), True)
        if isinstance(value, str):
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
            return _SHARDING_STRATEGIES[_sharding_name(value)]
        return value

    @property
    def wants_hybrid_shard(self) -> bool:
        """Whether the FSDP1 strategy named asks for HSDP (replicate x shard)."""
        names = (self.sharding_strategy, self.reshard_after_forward)
        return any(isinstance(n, str) and _sharding_name(n).lstrip("_").startswith("HYBRID") for n in names)

    @classmethod
    def from_config_dict(cls, config: dict[str, Any]) -> FullyShardedDataParallelPlugin:
        """The plugin for Accelerate's ``fsdp_config`` (YAML / launcher) keys, e.g.
        ``{"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "fsdp_offload_params": False}``.
        The plugin's own field names are accepted too."""
        own = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in config.items():
            name = _FSDP_CONFIG_KEYS.get(key, key if key in own else None)
            if name is None:
                unknown.append(key)
            else:
                values[name] = _from_yaml(value)
        if unknown:
            raise ValueError(f"fsdp_config has unknown keys {sorted(unknown)}; valid keys: "
                             f"{sorted(_FSDP_CONFIG_KEYS)}")
        return cls(**values)


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO with Accelerate's fields; the engine is built by ``prepare()``.

    ``hf_ds_config`` is DeepSpeed's own config (a path to a JSON file or a dict); without it the fields make
    one (ZeRO stage 2, gradient clipping 1.0 as in Accelerate). ``"auto"`` values in the config are filled
    from the fields, the Accelerator (mixed precision, accumulation) and the prepared objects (the data
    loader's batch size, the optimizer's and scheduler's settings). A field and the config that disagree are
    reported together with every other problem when the Accelerator is built::

        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0))
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"), mixed_precision="bf16")

    ``deepspeed_config`` holds the config (editable before ``prepare()``). ``zero3_init_flag`` makes
    ``zero3_init_context_manager()`` build models already sharded (ZeRO-3). See docs/deepspeed.md.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None
    deepspeed_config: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    selected: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        from overdrive.deepspeed.config import apply_fields, config_from_fields, read_config

        config, self.config_source = read_config(self.hf_ds_config)
        self.deepspeed_config = config if config is not None else config_from_fields(self)
        self._conflicts = apply_fields(self, self.deepspeed_config, self.config_source)

    def problems(self) -> list[str]:
        """Every invalid field, and every field the config contradicts (naming both values)."""
        from overdrive.deepspeed.config import plugin_problems

        return plugin_problems(self)

    def get_value(self, key: str, default: Any = None) -> Any:
        """The config's value at a dotted ``key`` such as ``"zero_optimization.stage"``."""
        from overdrive.deepspeed.config import get_path

        return get_path(self.deepspeed_config, key, default)

    def is_auto(self, key: str) -> bool:
        return self.get_value(key) == "auto"

    @property
    def zero_stage_in_use(self) -> int:
        from overdrive.deepspeed.config import zero_stage_of

        return zero_stage_of(self.deepspeed_config)

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag) and self.zero_stage_in_use == 3

    def zero3_init_context_manager(self, enable: bool = False) -> Any:
        """``deepspeed.zero.Init`` for this config when ZeRO-3 init is on (or ``enable``): modules built
        inside are sharded as they are created. A no-op context otherwise."""
        import contextlib

        if not (enable or self.is_zero3_init_enabled()):
            return contextlib.nullcontext()
        from overdrive.deepspeed import import_deepspeed

        zero = {k: v for k, v in self.deepspeed_config.get("zero_optimization", {}).items() if v != "auto"}
        dtypes = {k: {"enabled": self.get_value(f"{k}.enabled") is True} for k in ("bf16", "fp16")}
        return import_deepspeed().zero.Init(config_dict_or_path={"zero_optimization": zero, **dtypes,
                                                                 "train_micro_batch_size_per_gpu": 1})

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this the plugin the next ``prepare()`` uses (``accelerator.state.select_deepspeed_plugin``)."""
        self.selected = True

    @classmethod
    def from_config_dict(cls, config: dict[str, Any]) -> DeepSpeedPlugin:
        """The plugin for Accelerate's ``deepspeed_config`` (YAML / launcher) keys, e.g. ``{"zero_stage": 2,
        "offload_optimizer_device": "cpu", "gradient_clipping": 1.0, "deepspeed_config_file": "ds.json"}``."""
        from overdrive.deepspeed.config import plugin_from_config_dict

        return plugin_from_config_dict(cls, config)


@dataclass
class MegatronLMPlugin:
    """Megatron-LM model parallelism (``megatron-core``) with Accelerate's fields: ``tp_degree`` tensor
    parallel, ``pp_degree`` pipeline stages (``num_micro_batches`` each step), ``sequence_parallelism``,
    ``recompute_activations``, ``use_distributed_optimizer``, and ``custom_model_provider_function`` that
    builds the model. Checked when the Accelerator is built; needs ``pip install megatron-core``."""

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable | None = None
    scale_lr_cond: Callable | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable | None = None
    custom_prepare_model_function: Callable | None = None
    custom_megatron_datasets_provider_function: Callable | None = None
    custom_get_batch_function: Callable | None = None
    custom_loss_function: Callable | None = None
    other_megatron_args: dict[str, Any] | None = None

    def problems(self, world_size: int | None = None) -> list[str]:
        """Every invalid field (and, given ``world_size``, degrees that do not divide it)."""
        from overdrive.deepspeed.megatron import plugin_problems

        return plugin_problems(self, world_size)


def _from_yaml(value: Any) -> Any:
    """YAML and environment spell booleans and numbers as strings: read them back."""
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low.isdigit():
            return int(low)
    return value


def _sharding_name(value: Any) -> str:
    text = str(getattr(value, "name", value)).upper()
    return {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "4": "HYBRID_SHARD", "5": "_HYBRID_SHARD_ZERO2"}.get(text, text)


def _state_dict_name(value: Any) -> str:
    text = str(getattr(value, "name", value)).upper()
    return {"SHARDED": "SHARDED_STATE_DICT", "FULL": "FULL_STATE_DICT", "1": "FULL_STATE_DICT",
            "3": "SHARDED_STATE_DICT"}.get(text, text)


def _choice(enum_cls: type[enum.Enum], value: Any, name: str) -> Any:
    """``value`` as a member of ``enum_cls``, or an error that lists the valid values."""
    try:
        return enum_cls(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"{name}={value!r} is not valid; choose one of {valid}") from None


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
