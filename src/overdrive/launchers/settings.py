"""The launch settings: one table that drives the config file reader / writer, the ``ACCELERATE_*`` reader and
exporter, ``overdrive launch``'s flags, ``overdrive config``'s questions and docs/launch_settings.md.

Each :class:`Setting` says, once: its name (the key the workers' launch config holds it under), its kind
(the one validator, ``launchers/setting_kinds.py``), its default, where it sits in the config file
(Accelerate's YAML key; ``"fsdp_config.fsdp_version"`` for a key of a section), its environment variable
(Accelerate's), its flag (Accelerate's name; ``--name`` and ``--name-with-dashes``), its question and its
help. A bad value gives the same message whichever way it came in; only the label differs
(``--mixed_precision``, ``mixed_precision`` in a file, ``ACCELERATE_MIXED_PRECISION``).

Adding a setting is one entry in ``SETTINGS`` (ARCHITECTURE.md, "A launch setting")::

    Setting("my_setting", Int(minimum=1), "what it does", yaml=True, env="ACCELERATE_MY_SETTING", flag=True)

This module imports only ``config/`` and its kinds (``setting_kinds``): the CLI reads it before torch loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overdrive.config.choices import MIXED_PRECISION
from overdrive.config.compile import DYNAMO_BACKENDS, DYNAMO_MODES
from overdrive.config.enums import DistributedType
from overdrive.launchers.setting_kinds import (
    Bool,
    Bools,
    Choice,
    Device,
    Float,
    GpuIds,
    Int,
    Kind,
    LighthouseAddress,
    List,
    Mapping,
    Text,
)

#: Accelerate's distributed types, and "TPU", which older config files hold
DISTRIBUTED_TYPES = (*(member.value for member in DistributedType), "TPU")
COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE", "AMAZON_SAGEMAKER")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")

#: flag groups of ``overdrive launch --help``, in order (key -> title)
GROUPS = {
    "launch": "",
    "hardware": "hardware",
    "resources": "resources",
    "machines": "several machines and restarts",
    "deepspeed": "DeepSpeed (Accelerate's flags; also the config file's deepspeed_config keys)",
    "fsdp": "FSDP (Accelerate's flags; also the config file's fsdp_config keys)",
    "compile": "compile (Accelerate's flags; also the config file's dynamo_config keys)",
    "fp8": "fp8 (with --mixed_precision fp8; also the config file's fp8_config keys)",
    "parallelism": "parallelism config (with --use_parallelism_config; also the config file's parallelism_config keys)",
    "fault_tolerance": "fault-tolerant training over torchft (overdrive's; each launch is one replica group)",
    "other": "other Accelerate flags",
    "megatron": "Megatron-LM (accepted; --use_megatron_lm is refused)",
}
#: config file sections: name -> whether a key outside the schema is refused ("strict"), checked against the
#: plugin's fields ("plugin"), or kept as it is ("open")
SECTIONS = {"dynamo_config": "strict", "deepspeed_config": "plugin", "fsdp_config": "plugin", "fp8_config": "open",
            "parallelism_config": "open", "megatron_lm_config": "open", "ipex_config": "open",
            "mpirun_config": "open"}


@dataclass(frozen=True)
class Setting:
    """One launch setting and every way it is given (see the module docstring).

    ``yaml``: True for a top-level key named ``name``, a string for another key (``"use_cpu"``) or a key of a
    section (``"fsdp_config.fsdp_version"``), False for none. ``flag``: True for ``--name``, a string for
    another flag name, False for none. ``switch``: a flag without a value (True when given); ``append``: a
    flag given several times. ``refused``: the message when the flag is given (accepted for Accelerate's
    sake, not supported). ``hidden``: left out of ``--help`` and the docs table.
    """

    name: str
    kind: Kind
    help: str = ""
    yaml: bool | str = False
    env: str | None = None
    flag: bool | str = False
    default: Any = None
    question: str | None = None
    group: str = "other"
    switch: bool = False
    append: bool = False
    aliases: tuple[str, ...] = ()
    refused: str | None = None
    hidden: bool = False

    @property
    def flag_name(self) -> str | None:
        """The flag's name without ``--`` (None: no flag)."""
        return self.name if self.flag is True else (self.flag or None)

    @property
    def yaml_key(self) -> str | None:
        """The config file's key, dotted for a key of a section (None: not in the file)."""
        return self.name if self.yaml is True else (self.yaml or None)

    @property
    def place(self) -> tuple[str | None, str]:
        """Where the workers' launch config holds the value: ``(None, name)`` at the top level, else
        ``(section, key)`` as in the config file."""
        key = self.yaml_key
        if key and "." in key:
            section, inner = key.split(".", 1)
            return section, inner
        return None, self.name

    def check(self, label: str, value: Any) -> tuple[Any, str | None]:
        """The kind's check (``label``: how the value came in, e.g. ``--num_processes``)."""
        return self.kind.check(label, value)


_TPU = ("TPU (XLA) launches are not supported by overdrive: it runs on torch.distributed (CPU and GPUs "
        "through gloo / NCCL)")
_MEGATRON = ("--use_megatron_lm: training through Megatron-LM's engine is not available in overdrive; "
             "use FSDP2 with tensor parallelism (--use_fsdp --fsdp_version 2 --use_parallelism_config "
             "--parallelism_config_tp_size N) or DeepSpeed, or set up megatron-core's groups with "
             "overdrive.strategies.megatron.initialize_model_parallel(plugin)")
_MEGATRON_KEYS = (
    "tp_degree", "pp_degree", "num_micro_batches", "gradient_clipping", "sequence_parallelism",
    "recompute_activations", "use_distributed_optimizer", "use_custom_fsdp", "no_load_optim", "no_save_optim",
    "eod_mask_loss", "optimizer_cpu_offload", "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d",
    "decoder_last_pipeline_num_layers", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "attention_backend", "expert_model_parallel_size", "context_parallel_size", "attention_dropout",
    "hidden_dropout", "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
    "use_rotary_position_embeddings")
ANY = Kind()  # a value passed on as it is (a plugin reads it)
S, D, F, C, P = Setting, "deepspeed_config.", "fsdp_config.", "dynamo_config.", "parallelism_config."

SETTINGS: tuple[Setting, ...] = (
    # -- the launcher itself
    S("config_file", Text(metavar="PATH"), "config file to read (default: $OVERDRIVE_CONFIG_FILE or the one "
      "'overdrive config' wrote)", flag=True, group="launch"),
    S("quiet", Bool(), "print only the workers' output and failures, no launcher lines", flag=True, switch=True,
      aliases=("-q",), group="launch"),
    S("debug", Bool(), "show torchrun's own log and command, and check collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
      yaml=True, env="ACCELERATE_DEBUG_MODE", flag=True, switch=True, default=False, group="launch"),
    S("module", Bool(), "run the target as a module, like 'python -m'", flag=True, switch=True, aliases=("-m",), group="launch"),
    S("no_python", Bool(), "run the target as a program, without 'python' in front", flag=True, switch=True, group="launch"),
    S("as_accelerate", Bool(), "run an unmodified Accelerate script (or transformers / PEFT / TRL): 'import "
      "accelerate' gives overdrive in every worker (overdrive.install_as_accelerate)", flag=True, switch=True, group="launch"),
    # -- hardware and resources
    S("cpu", Bool(), "train on the CPU even if there is a GPU; joins CPU processes into one run (without it, "
      "processes started on a machine with no GPU each train alone, as under Accelerate)", yaml="use_cpu", env="ACCELERATE_USE_CPU", flag=True,
      switch=True, group="hardware", default=False, question="Train on the CPU only?"),
    S("multi_gpu", Bool(), "one process per GPU (on a machine without GPUs, as under accelerate launch: CPU processes that each train "
      "alone; add --cpu to join them)", flag=True,
      switch=True, group="hardware"),
    S("gpu_ids", GpuIds(), "the GPUs of this machine to use, e.g. '0,1'", yaml=True, flag=True, group="hardware",
      default="all", question="Which devices (by id) should be used?"),
    S("num_processes", Int(minimum=1, allow=(-1,)), "processes in all, over every machine (default: one per GPU, "
      "or 1)", yaml=True, flag=True, group="resources", question="How many processes in all?"),
    S("num_machines", Int(minimum=1, metavar="N|MIN:MAX"), "machines taking part; the flag also takes MIN:MAX, an "
      "elastic job that goes on with as few as MIN machines after one is lost (overdrive's extension: torchrun's "
      "--nnodes MIN:MAX, needs --rdzv_backend c10d or etcd-v2 and --max_restarts)", yaml=True, flag=True, group="resources",
      default=1,
      question="How many machines will take part?"),
    S("num_cpu_threads_per_process", Int(minimum=1), "OMP_NUM_THREADS of each worker (default: this machine's "
      "cores / its processes)", yaml=True, flag=True, group="resources"),
    S("mixed_precision", Choice(MIXED_PRECISION),
      "mixed precision of Accelerator()", yaml=True, env="ACCELERATE_MIXED_PRECISION", flag=True, group="resources",
      default="no", question="Mixed precision?"),
    S("gradient_accumulation_steps", Int(minimum=1), "micro-batches per optimizer step", yaml=True,
      env="ACCELERATE_GRADIENT_ACCUMULATION_STEPS", flag=True, group="resources", default=1),
    S("dynamo_backend", Choice(tuple(b.upper() for b in DYNAMO_BACKENDS), case="upper", metavar="BACKEND"),
      "torch.compile backend: no, inductor, eager, ...", yaml=C + "dynamo_backend", env="ACCELERATE_DYNAMO_BACKEND",
      flag=True, group="resources", default="NO", question="Which dynamo backend?"),
    # -- several machines and restarts
    S("machine_rank", Int(minimum=0), "this machine's rank, 0 for the main one", yaml=True, flag=True,
      group="machines", default=0, question="What is the rank of this machine (0 for the main one)?"),
    S("main_process_ip", Text(metavar="ADDR"), "address of the machine of rank 0", yaml=True, flag=True,
      group="machines", question="What is the IP address of the machine of rank 0?"),
    S("main_process_port", Int(minimum=1, maximum=65535, allow=(None,), metavar="PORT"), "port on the machine of "
      "rank 0 (default 29500)", yaml=True, flag=True, group="machines", question="Which port on it?"),
    S("same_network", Bool(), "all machines share a local network", yaml=True, flag=True, switch=True,
      group="machines", default=False, question="Are all the machines on the same local network?"),
    S("rdzv_backend", Choice(RDZV_BACKENDS), "torchrun rendezvous",
      yaml=True, flag=True, group="machines", default="static", question="Which rendezvous backend?"),
    S("rdzv_conf", Text(metavar="K=V,..."), "extra rendezvous settings for torchrun", yaml=True, flag=True,
      group="machines", default=""),
    S("max_restarts", Int(minimum=0), "restart the whole group up to N times when a process fails", yaml=True,
      flag=True, group="machines", default=0),
    S("monitor_interval", Float(above=0, metavar="SECONDS"), "how often the workers are checked", flag=True,
      group="machines", default=0.1),
    S("timeout", Float(above=0, metavar="SECONDS"), "how long a collective waits for every rank before the job "
      "ends with a hang report naming the rank that did not arrive (default: 180 on the CPU, 600 on GPUs)",
      flag=True, group="machines"),
    S("stall_timeout", Float(above=0, metavar="SECONDS"), "end the job with every rank's stack when no rank has "
      "issued a collective for this long (a hang outside collectives, which no timeout catches; default: off)",
      flag=True, group="machines"),
    S("log_dir", Text(metavar="DIR"), "keep each worker's logs here (default: a temporary directory)", flag=True,
      group="machines"),
    S("tee", Text(metavar="STREAMS"), "torchrun's --tee: 1 stdout, 2 stderr, 3 both, to log files and the console "
      "with a prefix", flag=True, group="machines", aliases=("-t",)),
    S("role", Text(metavar="NAME"), "torchrun's worker role name", flag=True, group="machines", default="default"),
    # -- DeepSpeed
    S("use_deepspeed", Bool(), "train with DeepSpeed ZeRO", env="ACCELERATE_USE_DEEPSPEED", flag=True, switch=True,
      group="deepspeed"),
    S("deepspeed_config_file", Text(), "DeepSpeed's JSON config; its \"auto\" values are filled by overdrive",
      yaml=D + "deepspeed_config_file", env="ACCELERATE_DEEPSPEED_CONFIG_FILE", flag=True, group="deepspeed"),
    S("zero_stage", Int(choices=(0, 1, 2, 3)), "ZeRO stage (default 2)", yaml=D + "zero_stage",
      env="ACCELERATE_DEEPSPEED_ZERO_STAGE", flag=True, group="deepspeed"),
    S("offload_optimizer_device", Choice(OFFLOAD_DEVICES), "offload the optimizer state (ZeRO 1-3)",
      yaml=D + "offload_optimizer_device", env="ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", flag=True,
      group="deepspeed"),
    S("offload_param_device", Choice(OFFLOAD_DEVICES), "offload the parameters (ZeRO-3)",
      yaml=D + "offload_param_device", env="ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", flag=True, group="deepspeed"),
    S("offload_optimizer_nvme_path", Text(), "folder for the optimizer offloaded to NVMe",
      yaml=D + "offload_optimizer_nvme_path", env="ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", flag=True,
      group="deepspeed"),
    S("offload_param_nvme_path", Text(), "folder for the parameters offloaded to NVMe",
      yaml=D + "offload_param_nvme_path", env="ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", flag=True,
      group="deepspeed"),
    S("gradient_clipping", Float(allow=("auto",)), "clip gradients to this global norm (DeepSpeed's default: 1.0; "
      "0: off)", yaml=D + "gradient_clipping", env="ACCELERATE_GRADIENT_CLIPPING", flag=True, group="deepspeed"),
    S("zero3_init_flag", Bool(), "build models already sharded under ZeRO-3 (deepspeed.zero.Init)",
      yaml=D + "zero3_init_flag", env="ACCELERATE_DEEPSPEED_ZERO3_INIT", flag=True, group="deepspeed"),
    S("zero3_save_16bit_model", Bool(), "ZeRO-3: gather 16-bit weights when DeepSpeed saves the model",
      yaml=D + "zero3_save_16bit_model", env="ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", flag=True,
      group="deepspeed"),
    S("deepspeed_moe_layer_cls_names", Text(), "mixture-of-experts layer classes, comma-separated",
      yaml=D + "deepspeed_moe_layer_cls_names", env="ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", flag=True,
      group="deepspeed"),
    S("deepspeed_multinode_launcher", Text(), "accepted for Accelerate: torchrun starts every machine's processes "
      "(run overdrive launch on each machine)", yaml=D + "deepspeed_multinode_launcher", flag=True,
      group="deepspeed"),
    S("deepspeed_hostfile", Text(), "accepted for Accelerate; not used (see --deepspeed_multinode_launcher)",
      yaml=D + "deepspeed_hostfile", flag=True, group="deepspeed"),
    S("deepspeed_exclusion_filter", Text(), "accepted for Accelerate; not used", yaml=D + "deepspeed_exclusion_filter",
      flag=True, group="deepspeed"),
    S("deepspeed_inclusion_filter", Text(), "accepted for Accelerate; not used", yaml=D + "deepspeed_inclusion_filter",
      flag=True, group="deepspeed"),
    # -- FSDP
    S("use_fsdp", Bool(), "train with fully sharded data parallel", env="ACCELERATE_USE_FSDP", flag=True,
      switch=True, group="fsdp"),
    S("fsdp_version", Int(choices=(1, 2)), "1 or 2 (both run on FSDP2's fully_shard)", yaml=F + "fsdp_version",
      env="FSDP_VERSION", flag=True, group="fsdp"),
    S("fsdp_sharding_strategy", ANY, "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or HYBRID_SHARD_ZERO2",
      yaml=F + "fsdp_sharding_strategy", env="FSDP_SHARDING_STRATEGY", flag=True, group="fsdp"),
    S("fsdp_reshard_after_forward", ANY, "true (free gathered weights after forward) or false",
      yaml=F + "fsdp_reshard_after_forward", env="FSDP_RESHARD_AFTER_FORWARD", flag=True, group="fsdp"),
    S("fsdp_auto_wrap_policy", ANY, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP",
      yaml=F + "fsdp_auto_wrap_policy", env="FSDP_AUTO_WRAP_POLICY", flag=True, group="fsdp"),
    S("fsdp_transformer_layer_cls_to_wrap", ANY, "classes that get their own shard group, comma-separated",
      yaml=F + "fsdp_transformer_layer_cls_to_wrap", env="FSDP_TRANSFORMER_CLS_TO_WRAP", flag=True, group="fsdp"),
    S("fsdp_min_num_params", Int(minimum=0), "SIZE_BASED_WRAP: parameters of a module with its own group",
      yaml=F + "fsdp_min_num_params", env="FSDP_MIN_NUM_PARAMS", flag=True, group="fsdp"),
    S("fsdp_offload_params", Bool(), "keep sharded parameters, gradients and optimizer state on the CPU",
      yaml=F + "fsdp_offload_params", env="FSDP_OFFLOAD_PARAMS", flag=True, group="fsdp"),
    S("fsdp_state_dict_type", ANY, "SHARDED_STATE_DICT or FULL_STATE_DICT", yaml=F + "fsdp_state_dict_type",
      env="FSDP_STATE_DICT_TYPE", flag=True, group="fsdp"),
    S("fsdp_activation_checkpointing", Bool(), "recompute each wrapped block's activations in backward",
      yaml=F + "fsdp_activation_checkpointing", env="FSDP_ACTIVATION_CHECKPOINTING", flag=True, group="fsdp"),
    S("fsdp_cpu_ram_efficient_loading", Bool(), "only rank 0 holds the full weights before sharding",
      yaml=F + "fsdp_cpu_ram_efficient_loading", env="FSDP_CPU_RAM_EFFICIENT_LOADING", flag=True, group="fsdp"),
    S("fsdp_sync_module_states", Bool(), "broadcast rank 0's weights before sharding",
      yaml=F + "fsdp_sync_module_states", env="FSDP_SYNC_MODULE_STATES", flag=True, group="fsdp"),
    S("fsdp_backward_prefetch", ANY, "accepted (an FSDP1 setting; FSDP2 prefetches by itself)",
      yaml=F + "fsdp_backward_prefetch", env="FSDP_BACKWARD_PREFETCH", flag=True, group="fsdp"),
    S("fsdp_forward_prefetch", Bool(), "accepted (an FSDP1 setting)", yaml=F + "fsdp_forward_prefetch",
      env="FSDP_FORWARD_PREFETCH", flag=True, group="fsdp"),
    S("fsdp_use_orig_params", Bool(), "accepted (an FSDP1 setting)", yaml=F + "fsdp_use_orig_params",
      env="FSDP_USE_ORIG_PARAMS", flag=True, group="fsdp"),
    S("fsdp_activation_checkpointing_offload", Bool(), "FSDP: only false is supported (activations stay where they "
      "are computed)", flag=True, group="other"),
    # -- compile
    S("dynamo_mode", Choice(DYNAMO_MODES), "torch.compile mode", yaml=C + "dynamo_mode", env="ACCELERATE_DYNAMO_MODE",
      flag=True, group="compile"),
    S("dynamo_use_fullgraph", Bool(), "compile the whole model as one graph", yaml=C + "dynamo_use_fullgraph",
      env="ACCELERATE_DYNAMO_USE_FULLGRAPH", flag=True, switch=True, group="compile"),
    S("dynamo_use_dynamic", Bool(), "compile with dynamic shapes (not given: torch.compile's own default)",
      yaml=C + "dynamo_use_dynamic",
      env="ACCELERATE_DYNAMO_USE_DYNAMIC", flag=True, switch=True, group="compile"),
    S("dynamo_use_regional_compilation", Bool(), "compile each repeated block once (regional compilation)",
      yaml=C + "dynamo_use_regional_compilation", env="ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", flag=True,
      switch=True, group="compile"),
    # -- fp8 (the defaults are those Accelerate's launcher exports with fp8 mixed precision)
    S("fp8_backend", Choice(("AO", "TE"), case="upper"), "fp8 back end: ao (torchao) or te",
      yaml="fp8_config.backend", env="ACCELERATE_FP8_BACKEND", flag=True, group="fp8"),
    S("fp8_use_autocast_during_eval", Bool(), "Transformer Engine", yaml="fp8_config.use_autocast_during_eval",
      env="ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", flag=True, switch=True, group="fp8", default=False),
    S("fp8_margin", Int(minimum=0), "Transformer Engine scaling margin", yaml="fp8_config.margin",
      env="ACCELERATE_FP8_MARGIN", flag=True, group="fp8", default=0),
    S("fp8_interval", Int(minimum=1), "Transformer Engine scaling interval", yaml="fp8_config.interval",
      env="ACCELERATE_FP8_INTERVAL", flag=True, group="fp8", default=1),
    S("fp8_format", Choice(("HYBRID", "E4M3", "E5M2"), case="upper"), "fp8 format", yaml="fp8_config.fp8_format",
      env="ACCELERATE_FP8_FORMAT", flag=True, group="fp8", default="HYBRID"),
    S("fp8_amax_history_len", Int(minimum=1), "Transformer Engine", yaml="fp8_config.amax_history_len",
      env="ACCELERATE_FP8_AMAX_HISTORY_LEN", flag=True, group="fp8", default=1024),
    S("fp8_amax_compute_algo", Choice(("max", "most_recent")), "Transformer Engine",
      yaml="fp8_config.amax_compute_algo", env="ACCELERATE_FP8_AMAX_COMPUTE_ALGO", flag=True, group="fp8",
      default="most_recent"),
    S("fp8_override_linear_precision", Bools(), "Transformer Engine: fprop,dgrad,wgrad in higher precision "
      "(exported as ACCELERATE_FP8_OVERRIDE_FPROP / _DGRAD / _WGRAD)", yaml="fp8_config.override_linear_precision",
      flag=True, group="fp8", default=(False, False, False)),
    S("fp8_enable_fsdp_float8_all_gather", Bool(), "torchao", yaml="fp8_config.enable_fsdp_float8_all_gather",
      env="ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", flag=True, group="fp8", default=True),
    S("fp8_pad_inner_dim", Bool(), "torchao", yaml="fp8_config.pad_inner_dim", env="ACCELERATE_FP8_PAD_INNER_DIM",
      flag=True, group="fp8", default=True),
    # -- parallelism config (the sizes are exported with --use_parallelism_config, the rest as Accelerate does)
    S("use_parallelism_config", Bool(), "build the device mesh from the --parallelism_config_* sizes",
      env="ACCELERATE_USE_PARALLELISM_CONFIG", flag=True, switch=True, group="parallelism"),
    S("parallelism_config_dp_replicate_size", Int(minimum=1), "replicated data-parallel degree",
      yaml=P + "parallelism_config_dp_replicate_size", env="PARALLELISM_CONFIG_DP_REPLICATE_SIZE", flag=True,
      group="parallelism", default=1),
    S("parallelism_config_dp_shard_size", Int(minimum=-1), "sharded data-parallel degree (-1: the rest)",
      yaml=P + "parallelism_config_dp_shard_size", env="PARALLELISM_CONFIG_DP_SHARD_SIZE", flag=True,
      group="parallelism", default=1),
    S("parallelism_config_tp_size", Int(minimum=1), "tensor-parallel degree", yaml=P + "parallelism_config_tp_size",
      env="PARALLELISM_CONFIG_TP_SIZE", flag=True, group="parallelism", default=1),
    S("parallelism_config_cp_size", Int(minimum=1), "context-parallel degree", yaml=P + "parallelism_config_cp_size",
      env="PARALLELISM_CONFIG_CP_SIZE", flag=True, group="parallelism", default=1),
    S("parallelism_config_cp_backend", Choice(("torch",)), "torch (the only one)", yaml=P + "cp_backend", flag=True,
      group="parallelism", default="torch"),
    S("parallelism_config_cp_comm_strategy", Choice(("allgather", "alltoall")), "context parallelism's exchange "
      "(default allgather, exported with context parallelism)", yaml=P + "cp_comm_strategy", flag=True,
      group="parallelism"),
    S("parallelism_config_sp_size", Int(minimum=1), "DeepSpeed sequence parallelism (Ulysses): only 1 is supported",
      yaml=P + "sp_size", flag=True, group="parallelism", default=1),
    S("parallelism_config_sp_backend", Choice(("deepspeed",)), "sequence parallelism back end", yaml=P + "sp_backend",
      flag=True, group="parallelism", default="deepspeed"),
    S("parallelism_config_sp_seq_length", Text(), "sequence parallelism (not supported)", yaml=P + "sp_seq_length",
      flag=True, group="parallelism"),
    S("parallelism_config_sp_seq_length_is_variable", Bool(), "sequence parallelism (not supported)",
      yaml=P + "sp_seq_length_is_variable", flag=True, group="parallelism"),
    S("parallelism_config_sp_attn_implementation", Text(), "sequence parallelism (not supported)",
      yaml=P + "sp_attn_implementation", flag=True, group="parallelism"),
    # -- fault tolerance (overdrive's: torchft)
    S("ft_lighthouse", LighthouseAddress(), "train fault-tolerant through the torchft lighthouse at this address "
      "(started by 'overdrive lighthouse'): a lost replica group drops out of the step and the others go on; a "
      "relaunched one heals from a live one", yaml=True, env="OVERDRIVE_FT_LIGHTHOUSE", flag=True,
      group="fault_tolerance"),
    S("ft_replica_group", Int(minimum=0), "this launch's replica group, 0 .. groups-1 (default: --machine_rank)",
      yaml=True, env="OVERDRIVE_FT_REPLICA_GROUP", flag=True, group="fault_tolerance"),
    S("ft_num_replica_groups", Int(minimum=1), "replica groups the data is sharded over (default: --num_machines)",
      yaml=True, env="OVERDRIVE_FT_NUM_REPLICA_GROUPS", flag=True, group="fault_tolerance"),
    # -- other Accelerate flags and keys
    S("downcast_bf16", Bool(), "TPU bf16 setting; accepted, no effect elsewhere (as in Accelerate)", yaml=True,
      env="ACCELERATE_DOWNCAST_BF16", flag=True, switch=True, group="other"),
    S("enable_cpu_affinity", Bool(), "pin each process to the CPUs near its GPU", yaml=True,
      env="ACCELERATE_CPU_AFFINITY", flag="enable_cpu_affinity", switch=True, group="other"),
    S("main_training_function", Text(), "TPU launches' entry function; accepted, no effect elsewhere (as in "
      "Accelerate)", yaml=True, flag=True, group="other"),
    S("torch_device", Device(), "the device of each worker (Accelerate's launcher sets it)",
      env="ACCELERATE_TORCH_DEVICE"),
    S("tpu", Bool(), "refused: TPU launches are not supported", flag=True, switch=True, group="other",
      refused=f"--tpu: {_TPU}"),
    S("tpu_use_cluster", Bool(), "refused: TPU pods are not supported", yaml=True, flag="tpu_cluster", switch=True,
      group="other", refused=f"--tpu_cluster: {_TPU}"),
    S("tpu_use_sudo", Bool(), "refused: TPU pods are not supported", yaml=True, flag=True, switch=True,
      group="other", refused=f"--tpu_use_sudo: {_TPU}"),
    S("vm", Text(metavar="NAME"), "refused: TPU pods are not supported", flag=True, append=True, group="other",
      refused=f"--vm: {_TPU}"),
    S("env", Text(metavar="NAME=VALUE"), "refused: TPU pods are not supported", flag=True, append=True,
      group="other", refused=f"--env: it sets variables on TPU pod machines; {_TPU} (export variables in the "
      "shell instead)"),
    S("mpirun_hostfile", Text(metavar="PATH"), "refused: run mpirun yourself (see the error)", flag=True,
      group="other", refused="--mpirun_hostfile: overdrive launch starts processes with torchrun, not mpirun; run "
      "'mpirun -f HOSTFILE -n N python script.py' yourself (overdrive reads Open MPI / MVAPICH / Intel MPI ranks), "
      "or run 'overdrive launch --num_machines M --machine_rank R --main_process_ip ADDR' on each machine"),
    S("aws_access_key_id", Text(metavar="KEY"), "SageMaker only: accepted and ignored, as Accelerate does off "
      "SageMaker", flag=True, group="other"),
    S("aws_secret_access_key", Text(metavar="KEY"), "SageMaker only: accepted and ignored", flag=True,
      group="other"),
    S("use_megatron_lm", Bool(), "refused: Megatron-LM's training engine is not available",
      env="ACCELERATE_USE_MEGATRON_LM", flag=True, switch=True, group="megatron", refused=_MEGATRON),
    *(S(f"megatron_lm_{key}", ANY, "accepted; no effect (Megatron-LM's engine is refused)", flag=True,
        group="megatron", hidden=True) for key in _MEGATRON_KEYS),
    # -- config file keys without a flag (Accelerate writes them)
    S("compute_environment", Choice(COMPUTE_ENVIRONMENTS, case="upper"), "where the job runs", yaml=True,
      default="LOCAL_MACHINE"),
    S("distributed_type", Choice(DISTRIBUTED_TYPES, case="upper"), "Accelerate's kind of training (FSDP and "
      "DEEPSPEED choose those strategies)", yaml=True, default="NO"),
    *(S(name, Mapping(), f"a section: {name[:-7]}'s keys", yaml=True) for name in SECTIONS),
    *(S(name, Text(), "TPU / SageMaker (accepted, not used)", yaml=True) for name in (
        "tpu_name", "tpu_zone", "command_file", "ec2_instance_type", "iam_role_name", "image_uri", "profile",
        "region", "base_job_name", "pytorch_version", "transformers_version", "py_version",
        "sagemaker_inputs_file", "sagemaker_metrics_file")),
    *(S(name, List(), "TPU (accepted, not used)", yaml=True) for name in ("tpu_vm", "tpu_env", "commands")),
    S("additional_args", ANY, "SageMaker (accepted, not used)", yaml=True),
)
del S, D, F, C, P


def current(settings: Sequence[Setting] | None = None) -> Sequence[Setting]:
    """``settings``, or the schema (``SETTINGS``, looked up at each call: a test may swap in a copy)."""
    return SETTINGS if settings is None else settings


def by_name(settings: Sequence[Setting] | None = None) -> dict[str, Setting]:
    """The settings by name."""
    return {s.name: s for s in current(settings)}


def by_yaml_key(settings: Sequence[Setting] | None = None) -> dict[str, Setting]:
    """The settings by config file key (``"use_cpu"``, ``"fsdp_config.fsdp_version"``)."""
    return {s.yaml_key: s for s in current(settings) if s.yaml_key}


def by_env(settings: Sequence[Setting] | None = None) -> dict[str, Setting]:
    """The settings by environment variable."""
    return {s.env: s for s in current(settings) if s.env}


def section_defaults(section: str, settings: Sequence[Setting] | None = None) -> dict[str, Any]:
    """``{key: default}`` of a config file section's settings that have a default."""
    out = {}
    for s in current(settings):
        where, key = s.place
        if where == section and s.default is not None:
            out[key] = list(s.default) if isinstance(s.default, tuple) else s.default
    return out


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


def settings_table(settings: Sequence[Setting] | None = None) -> str:
    """The docs table (docs/launch_settings.md): one row per setting that is not hidden."""
    rows = ["| setting | flag | config file key | environment variable | value | default | what it does |",
            "|---|---|---|---|---|---|---|"]
    for s in current(settings):
        if s.hidden:
            continue
        flag = f"`--{s.flag_name}`" if s.flag_name else ""
        value = "switch" if s.switch else "repeatable" if s.append else s.kind.describe()
        shown = str(s.default).lower() if isinstance(s.default, bool) else s.default
        default = "" if s.default in (None, "") else f"`{shown}`"
        help_text = ("refused: " + s.help.removeprefix("refused: ")) if s.refused else s.help
        cells = [f"`{s.name}`", flag, f"`{s.yaml_key}`" if s.yaml_key else "", f"`{s.env}`" if s.env else "",
                 value, default, help_text]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"
