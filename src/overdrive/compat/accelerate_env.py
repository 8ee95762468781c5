"""Accelerate's ``ACCELERATE_*`` (and ``FSDP_*``, ``PARALLELISM_CONFIG_*``) variables, with Accelerate's meaning.

Two directions, both pure functions over plain mappings (the resolver reads ``os.environ`` and the
launcher writes the worker environment; nothing here touches the process environment):

- :func:`settings_from_environment`: the variables a process was started with -> the launch-config keys
  the resolver understands (``mixed_precision``, ``cpu``, ``fsdp_config``...). A bad value raises
  ``ValueError`` naming the variable, the value and the valid choices; unknown ``ACCELERATE_*`` names are
  left alone (Accelerate sets many for its own bookkeeping).
- :func:`variables_for_workers`: a launch config -> the variables Accelerate's launcher would export, so
  that libraries reading them directly (transformers' ``TrainingArguments`` reads
  ``ACCELERATE_MIXED_PRECISION``) agree with ``overdrive launch``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from overdrive.config.choices import invalid_choice
from overdrive.config.compile import DYNAMO_BACKENDS, DYNAMO_MODES

_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f")


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={raw!r} is not a yes/no value; use one of {', '.join(_TRUE + _FALSE)}")


def _int(minimum: int) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ValueError(f"{name}={raw!r} is not valid; it must be an integer >= {minimum}")
        return value

    return parse


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def _choice(*choices: str, lower: bool = True) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower() if lower else raw.strip().upper()
        if value not in choices:
            raise ValueError(invalid_choice(f"{name}={raw!r}", raw, choices))
        return value

    return parse


def _text(name: str, raw: str) -> str:
    return raw


def _device(name: str, raw: str) -> str:
    import torch

    try:
        return str(torch.device(raw.strip()))
    except (RuntimeError, ValueError):
        raise ValueError(f"{name}={raw!r} is not a torch device; use e.g. cpu, cuda, cuda:1, xpu:0") from None


_OFFLOAD = _choice("none", "cpu", "nvme")

#: variable -> (section of the launch config or None for the top level, key, parser)
VARIABLES: dict[str, tuple[str | None, str, Callable[[str, str], Any]]] = {
    "ACCELERATE_MIXED_PRECISION": (None, "mixed_precision", _choice("no", "fp16", "bf16", "fp8")),
    "ACCELERATE_USE_CPU": (None, "cpu", _bool),
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": (None, "gradient_accumulation_steps", _int(1)),
    "ACCELERATE_DEBUG_MODE": (None, "debug", _bool),
    "ACCELERATE_DOWNCAST_BF16": (None, "downcast_bf16", _bool),
    "ACCELERATE_DYNAMO_BACKEND": ("dynamo_config", "dynamo_backend", _choice(*DYNAMO_BACKENDS)),
    "ACCELERATE_DYNAMO_MODE": ("dynamo_config", "dynamo_mode",
                               _choice(*DYNAMO_MODES)),
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": ("dynamo_config", "dynamo_use_fullgraph", _bool),
    "ACCELERATE_DYNAMO_USE_DYNAMIC": ("dynamo_config", "dynamo_use_dynamic", _bool),
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": ("dynamo_config", "dynamo_use_regional_compilation", _bool),
    "ACCELERATE_USE_FSDP": (None, "use_fsdp", _bool),
    "FSDP_VERSION": ("fsdp_config", "fsdp_version", _int(1)),
    "FSDP_SHARDING_STRATEGY": ("fsdp_config", "fsdp_sharding_strategy", _text),
    "FSDP_RESHARD_AFTER_FORWARD": ("fsdp_config", "fsdp_reshard_after_forward", _text),
    "FSDP_OFFLOAD_PARAMS": ("fsdp_config", "fsdp_offload_params", _bool),
    "FSDP_AUTO_WRAP_POLICY": ("fsdp_config", "fsdp_auto_wrap_policy", _text),
    "FSDP_TRANSFORMER_CLS_TO_WRAP": ("fsdp_config", "fsdp_transformer_layer_cls_to_wrap", _text),
    "FSDP_MIN_NUM_PARAMS": ("fsdp_config", "fsdp_min_num_params", _int(0)),
    "FSDP_STATE_DICT_TYPE": ("fsdp_config", "fsdp_state_dict_type", _text),
    "FSDP_ACTIVATION_CHECKPOINTING": ("fsdp_config", "fsdp_activation_checkpointing", _bool),
    "FSDP_CPU_RAM_EFFICIENT_LOADING": ("fsdp_config", "fsdp_cpu_ram_efficient_loading", _bool),
    "FSDP_SYNC_MODULE_STATES": ("fsdp_config", "fsdp_sync_module_states", _bool),
    "FSDP_BACKWARD_PREFETCH": ("fsdp_config", "fsdp_backward_prefetch", _text),
    "FSDP_FORWARD_PREFETCH": ("fsdp_config", "fsdp_forward_prefetch", _bool),
    "FSDP_USE_ORIG_PARAMS": ("fsdp_config", "fsdp_use_orig_params", _bool),
    "ACCELERATE_USE_DEEPSPEED": (None, "use_deepspeed", _bool),
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": ("deepspeed_config", "zero_stage", _choice("0", "1", "2", "3")),
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": ("deepspeed_config", "deepspeed_config_file", _text),
    "ACCELERATE_GRADIENT_CLIPPING": ("deepspeed_config", "gradient_clipping", _float),
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": ("deepspeed_config", "offload_optimizer_device", _OFFLOAD),
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": ("deepspeed_config", "offload_param_device", _OFFLOAD),
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": ("deepspeed_config", "offload_optimizer_nvme_path", _text),
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": ("deepspeed_config", "offload_param_nvme_path", _text),
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": ("deepspeed_config", "zero3_init_flag", _bool),
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": ("deepspeed_config", "zero3_save_16bit_model", _bool),
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": ("deepspeed_config", "deepspeed_moe_layer_cls_names", _text),
    # rarer ones: Accelerate's launcher sets them, its state / plugins read them
    "ACCELERATE_TORCH_DEVICE": (None, "torch_device", _device),
    "ACCELERATE_USE_MEGATRON_LM": (None, "use_megatron_lm", _bool),
    "ACCELERATE_USE_PARALLELISM_CONFIG": (None, "use_parallelism_config", _bool),
    "ACCELERATE_CPU_AFFINITY": (None, "cpu_affinity", _bool),
    "ACCELERATE_FP8_BACKEND": ("fp8_config", "backend", _choice("AO", "TE", "MSAMP", lower=False)),
    "ACCELERATE_FP8_FORMAT": ("fp8_config", "fp8_format", _choice("HYBRID", "E4M3", "E5M2", lower=False)),
    "ACCELERATE_FP8_MARGIN": ("fp8_config", "margin", _int(0)),
    "ACCELERATE_FP8_INTERVAL": ("fp8_config", "interval", _int(1)),
    "ACCELERATE_FP8_AMAX_HISTORY_LEN": ("fp8_config", "amax_history_len", _int(1)),
    "ACCELERATE_FP8_AMAX_COMPUTE_ALGO": ("fp8_config", "amax_compute_algo", _choice("max", "most_recent")),
    "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": ("fp8_config", "use_autocast_during_eval", _bool),
    "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": ("fp8_config", "enable_fsdp_float8_all_gather", _bool),
    "ACCELERATE_FP8_PAD_INNER_DIM": ("fp8_config", "pad_inner_dim", _bool),
    "ACCELERATE_FP8_OPT_LEVEL": ("fp8_config", "opt_level", _text),
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": ("parallelism_config", "parallelism_config_dp_replicate_size", _int(1)),
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": ("parallelism_config", "parallelism_config_dp_shard_size", _int(-1)),
    "PARALLELISM_CONFIG_TP_SIZE": ("parallelism_config", "parallelism_config_tp_size", _int(1)),
    "PARALLELISM_CONFIG_CP_SIZE": ("parallelism_config", "parallelism_config_cp_size", _int(1)),
}


def settings_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The launch-config settings the ``ACCELERATE_*`` variables in ``environ`` ask for (empty when none
    is set). Raises ``ValueError`` listing every bad value, each naming its variable."""
    settings: dict[str, Any] = {}
    problems: list[str] = []
    for name, (section, key, parse) in VARIABLES.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            value = parse(name, raw)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        (settings.setdefault(section, {}) if section else settings)[key] = value
    if problems:
        raise ValueError("invalid Accelerate environment variables:\n  - " + "\n  - ".join(problems))
    if settings.pop("use_fsdp", False):
        settings["distributed_type"] = "FSDP"
    if settings.pop("use_deepspeed", False):
        if settings.get("distributed_type") == "FSDP":
            raise ValueError("ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED are both set; choose one")
        settings["distributed_type"] = "DEEPSPEED"
    if settings.pop("use_megatron_lm", False):
        if settings.get("distributed_type") in ("FSDP", "DEEPSPEED"):
            raise ValueError(f"ACCELERATE_USE_MEGATRON_LM and ACCELERATE_USE_{settings['distributed_type']} are both "
                             "set; choose one")
        settings["distributed_type"] = "MEGATRON_LM"
    if "use_parallelism_config" in settings and not settings.pop("use_parallelism_config"):
        settings.pop("parallelism_config", None)  # switched off: Accelerate ignores PARALLELISM_CONFIG_*
    if settings.get("mixed_precision") != "fp8":
        settings.pop("fp8_config", None)  # Accelerate reads the fp8 back end only with fp8 mixed precision
    for section, kind in (("fsdp_config", "FSDP"), ("deepspeed_config", "DEEPSPEED")):
        if section in settings and settings.get("distributed_type") != kind:
            del settings[section]  # Accelerate reads these only when the strategy is switched on
    dynamo = settings.get("dynamo_config", {})
    if "dynamo_backend" in dynamo:
        settings["dynamo_backend"] = dynamo["dynamo_backend"]
    return settings


def variables_for_workers(worker_config: Mapping[str, Any]) -> dict[str, str]:
    """The ``ACCELERATE_*`` variables Accelerate's launcher would export for ``worker_config``."""
    out: dict[str, str] = {}
    reverse = {(section, key): name for name, (section, key, _) in VARIABLES.items()}

    def put(section: str | None, key: str, value: Any) -> None:
        name = reverse.get((section, key))
        if name is not None and value is not None:
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)

    for key in ("mixed_precision", "cpu", "gradient_accumulation_steps", "debug", "downcast_bf16",
                "torch_device", "cpu_affinity"):
        put(None, key, worker_config.get(key))
    kind = str(worker_config.get("distributed_type") or "").upper()
    if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        out[f"ACCELERATE_USE_{kind}"] = "true"
    if worker_config.get("parallelism_config"):
        out["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    for section in ("fsdp_config", "deepspeed_config", "dynamo_config", "parallelism_config", "fp8_config"):
        for key, value in (worker_config.get(section) or {}).items():
            put(section, key, value)
    override = (worker_config.get("fp8_config") or {}).get("override_linear_precision")
    if override is not None:  # Accelerate's three variables for the one setting
        for part, value in zip(("FPROP", "DGRAD", "WGRAD"), override):
            out[f"ACCELERATE_FP8_OVERRIDE_{part}"] = str(bool(value))
    # the parallelism settings overdrive's workers do not read, exported as Accelerate's launcher does
    for key, value in (worker_config.get("parallelism_variables") or {}).items():
        out[f"PARALLELISM_CONFIG_{key.upper()}"] = str(value)
    backend = worker_config.get("dynamo_backend")
    if backend:
        out["ACCELERATE_DYNAMO_BACKEND"] = str(backend).upper()
    return out
