"""The rest of ``accelerate launch``'s flags: compile, fp8, the parallelism config, TPU, SageMaker, MPI and
Megatron-LM, each with Accelerate's meaning.

A flag given lands in the launch config the workers read, under the config file's key (``dynamo_config``,
``fp8_config``, ``parallelism_config`` or the top level), so flag and file mean the same; the launcher then
exports Accelerate's variables for it (``overdrive.compat.accelerate_env.variables_for_workers``). A flag
whose feature overdrive does not have is accepted by the parser and refused, naming it, when given. Nothing
here imports torch: ``overdrive launch`` checks its arguments before it loads torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from overdrive.cli import add_flag
from overdrive.config.choices import invalid_choice
from overdrive.launchers import config_file as cf

#: Accelerate's choices for flags that take one
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
FP8_BACKENDS = ("ao", "te", "msamp")
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")


@dataclass(frozen=True)
class Flag:
    """One Accelerate flag: where its value goes in the launch config and how it is checked.

    ``section`` None: the top level of the launch config; ``switch``: a flag without a value (True when given).
    """

    section: str | None
    key: str
    checker: cf.Checker = cf._text
    switch: bool = False
    help: str = ""


def _upper_choice(choices: tuple[str, ...]) -> cf.Checker:
    def check(label: str, value: Any) -> tuple[Any, str | None]:
        text = str(value).strip()
        if text.upper() in (c.upper() for c in choices):
            return text.upper(), None
        return value, invalid_choice(f"{label} {value!r}", value, choices)
    return check


def _override(label: str, value: Any) -> tuple[Any, str | None]:
    """Accelerate's ``--fp8_override_linear_precision``: three booleans (fprop, dgrad, wgrad), e.g.
    ``False,False,True`` or ``(false, false, true)``."""
    parts = [p.strip() for p in str(value).strip("()[] ").split(",") if p.strip()]
    checked = [cf._bool(label, p) for p in parts]
    if len(parts) != 3 or any(problem for _, problem in checked):
        return value, f"{label} {value!r} is not three booleans (fprop, dgrad, wgrad), e.g. False,False,True"
    return [v for v, _ in checked], None


def _bool_value(label: str, value: Any) -> tuple[Any, str | None]:
    return cf._bool(label, value)


_D, _F, _P = "dynamo_config", "fp8_config", "parallelism_config"
#: flag name -> where it goes; the flags overdrive carries out
FLAGS: dict[str, Flag] = {
    "dynamo_mode": Flag(_D, "dynamo_mode", cf._choice(DYNAMO_MODES), help="torch.compile mode"),
    "dynamo_use_fullgraph": Flag(_D, "dynamo_use_fullgraph", switch=True, help="compile the whole model as one graph"),
    "dynamo_use_dynamic": Flag(_D, "dynamo_use_dynamic", switch=True, help="compile with dynamic shapes"),
    "dynamo_use_regional_compilation": Flag(_D, "dynamo_use_regional_compilation", switch=True,
                                            help="compile each repeated block once (regional compilation)"),
    "downcast_bf16": Flag(None, "downcast_bf16", switch=True, help="TPU bf16 setting; accepted, no effect elsewhere "
                                                                   "(as in Accelerate)"),
    "enable_cpu_affinity": Flag(None, "enable_cpu_affinity", switch=True,
                                help="pin each process to the CPUs near its GPU (ACCELERATE_CPU_AFFINITY=1)"),
    "main_training_function": Flag(None, "main_training_function",
                                   help="TPU launches' entry function; accepted, no effect elsewhere (as in Accelerate)"),
    "fp8_backend": Flag(_F, "backend", _upper_choice(FP8_BACKENDS), help="fp8 back end: ao (torchao) or te"),
    "fp8_use_autocast_during_eval": Flag(_F, "use_autocast_during_eval", switch=True, help="Transformer Engine"),
    "fp8_margin": Flag(_F, "margin", cf._int(minimum=0), help="Transformer Engine scaling margin"),
    "fp8_interval": Flag(_F, "interval", cf._int(minimum=1), help="Transformer Engine scaling interval"),
    "fp8_format": Flag(_F, "fp8_format", _upper_choice(FP8_FORMATS), help="HYBRID, E4M3 or E5M2"),
    "fp8_amax_history_len": Flag(_F, "amax_history_len", cf._int(minimum=1), help="Transformer Engine"),
    "fp8_amax_compute_algo": Flag(_F, "amax_compute_algo", cf._choice(("max", "most_recent")),
                                  help="Transformer Engine: max or most_recent"),
    "fp8_override_linear_precision": Flag(_F, "override_linear_precision", _override,
                                          help="Transformer Engine: fprop,dgrad,wgrad in higher precision"),
    "fp8_opt_level": Flag(_F, "opt_level", cf._choice(("O1", "O2")), help="MS-AMP only (not supported)"),
    "fp8_enable_fsdp_float8_all_gather": Flag(_F, "enable_fsdp_float8_all_gather", _bool_value, help="torchao"),
    "fp8_pad_inner_dim": Flag(_F, "pad_inner_dim", _bool_value, help="torchao"),
    "parallelism_config_dp_replicate_size": Flag(_P, "parallelism_config_dp_replicate_size", cf._int(minimum=1)),
    "parallelism_config_dp_shard_size": Flag(_P, "parallelism_config_dp_shard_size", cf._int(minimum=-1)),
    "parallelism_config_tp_size": Flag(_P, "parallelism_config_tp_size", cf._int(minimum=1)),
    "parallelism_config_cp_size": Flag(_P, "parallelism_config_cp_size", cf._int(minimum=1)),
    "parallelism_config_cp_backend": Flag(_P, "cp_backend", cf._choice(("torch",)), help="torch (the only one)"),
    "parallelism_config_cp_comm_strategy": Flag(_P, "cp_comm_strategy", cf._choice(("allgather", "alltoall"))),
    "parallelism_config_sp_size": Flag(_P, "sp_size", cf._int(minimum=1),
                                       help="DeepSpeed sequence parallelism (Ulysses): only 1 is supported"),
    "parallelism_config_sp_backend": Flag(_P, "sp_backend", cf._choice(("deepspeed",))),
    "parallelism_config_sp_seq_length": Flag(_P, "sp_seq_length"),
    "parallelism_config_sp_seq_length_is_variable": Flag(_P, "sp_seq_length_is_variable", _bool_value),
    "parallelism_config_sp_attn_implementation": Flag(_P, "sp_attn_implementation"),
}
#: the fp8 settings Accelerate's launcher exports with fp8 mixed precision when not given (its flags' defaults)
FP8_DEFAULTS = {"use_autocast_during_eval": False, "margin": 0, "interval": 1, "fp8_format": "HYBRID",
                "amax_history_len": 1024, "amax_compute_algo": "most_recent",
                "override_linear_precision": [False, False, False], "opt_level": "O2",
                "enable_fsdp_float8_all_gather": True, "pad_inner_dim": True}
#: the parallelism sizes Accelerate always exports with --use_parallelism_config (its flags' defaults)
PARALLELISM_DEFAULTS = {"parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 1,
                        "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1}
#: the parallelism settings that are not sizes: exported as Accelerate does, not read by overdrive's workers
PARALLELISM_EXTRAS = {"cp_backend": "torch", "sp_size": 1, "sp_backend": "deepspeed"}

_MEGATRON = ("tp_degree", "pp_degree", "num_micro_batches", "gradient_clipping", "sequence_parallelism",
             "recompute_activations", "use_distributed_optimizer", "use_custom_fsdp", "no_load_optim",
             "no_save_optim", "eod_mask_loss", "optimizer_cpu_offload", "use_precision_aware_optimizer",
             "overlap_cpu_optimizer_d2h_h2d", "decoder_last_pipeline_num_layers", "recompute_granularity",
             "recompute_method", "recompute_num_layers", "attention_backend", "expert_model_parallel_size",
             "context_parallel_size", "attention_dropout", "hidden_dropout", "attention_softmax_in_fp32",
             "expert_tensor_parallel_size", "calculate_per_token_loss", "use_rotary_position_embeddings")
_MEGATRON_REFUSAL = ("--use_megatron_lm: training through Megatron-LM's engine is not available in overdrive; "
                     "use FSDP2 with tensor parallelism (--use_fsdp --fsdp_version 2 --use_parallelism_config "
                     "--parallelism_config_tp_size N) or DeepSpeed, or set up megatron-core's groups with "
                     "overdrive.strategies.megatron.initialize_model_parallel(plugin)")
_TPU_REFUSAL = ("TPU (XLA) launches are not supported by overdrive: it runs on torch.distributed (CPU and GPUs "
                "through gloo / NCCL)")
#: flags accepted and refused when given: name -> why
REFUSED = {
    "tpu": f"--tpu: {_TPU_REFUSAL}",
    "tpu_use_cluster": f"--tpu_cluster: {_TPU_REFUSAL}",
    "tpu_use_sudo": f"--tpu_use_sudo: {_TPU_REFUSAL}",
    "vm": f"--vm: {_TPU_REFUSAL}",
    "env": f"--env: it sets variables on TPU pod machines; {_TPU_REFUSAL} (export variables in the shell instead)",
    "mpirun_hostfile": ("--mpirun_hostfile: overdrive launch starts processes with torchrun, not mpirun; run "
                        "'mpirun -f HOSTFILE -n N python script.py' yourself (overdrive reads Open MPI / MVAPICH / "
                        "Intel MPI ranks), or run 'overdrive launch --num_machines M --machine_rank R "
                        "--main_process_ip ADDR' on each machine"),
    "use_megatron_lm": _MEGATRON_REFUSAL,
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add Accelerate's compile, fp8, parallelism, TPU, SageMaker, MPI and Megatron-LM flags."""
    groups: dict[str | None, Any] = {
        _D: parser.add_argument_group("compile (Accelerate's flags; also the config file's dynamo_config keys)"),
        _F: parser.add_argument_group("fp8 (with --mixed_precision fp8; also the config file's fp8_config keys)"),
        _P: parser.add_argument_group("parallelism config (with --use_parallelism_config; also the config "
                                      "file's parallelism_config keys)"),
        None: parser.add_argument_group("other Accelerate flags"),
    }
    add_flag(groups[_P], "use_parallelism_config", action="store_true", default=None,
             help="build the device mesh from the --parallelism_config_* sizes")
    for name, flag in FLAGS.items():
        extra: dict[str, Any] = {"action": "store_true", "default": None} if flag.switch else {"metavar": "VALUE"}
        add_flag(groups[flag.section], name, help=flag.help or None, **extra)
    other = groups[None]
    add_flag(other, "tpu", action="store_true", default=None, help="refused: TPU launches are not supported")
    for spelling in ("tpu_cluster", "tpu-cluster"):
        other.add_argument(f"--{spelling}", dest="tpu_use_cluster", action="store_true", default=None,
                           help="refused: TPU pods are not supported" if spelling == "tpu_cluster" else argparse.SUPPRESS)
    for spelling in ("no_tpu_cluster", "no-tpu-cluster"):
        other.add_argument(f"--{spelling}", dest="tpu_use_cluster", action="store_false", help=argparse.SUPPRESS)
    add_flag(other, "tpu_use_sudo", action="store_true", default=None, help="refused: TPU pods are not supported")
    add_flag(other, "vm", action="append", metavar="NAME", help="refused: TPU pods are not supported")
    add_flag(other, "env", action="append", metavar="NAME=VALUE", help="refused: TPU pods are not supported")
    add_flag(other, "mpirun_hostfile", metavar="PATH", help="refused: run mpirun yourself (see the error)")
    add_flag(other, "aws_access_key_id", metavar="KEY", help="SageMaker only: accepted and ignored, as Accelerate "
                                                             "does off SageMaker")
    add_flag(other, "aws_secret_access_key", metavar="KEY", help="SageMaker only: accepted and ignored")
    add_flag(other, "fsdp_activation_checkpointing_offload", metavar="VALUE", nargs="?", const="true",
             help="FSDP: only false is supported (activations stay where they are computed)")
    megatron = parser.add_argument_group("Megatron-LM (accepted; --use_megatron_lm is refused)")
    add_flag(megatron, "use_megatron_lm", action="store_true", default=None,
             help="refused: Megatron-LM's training engine is not available")
    for name in _MEGATRON:
        add_flag(megatron, f"megatron_lm_{name}", metavar="VALUE", help=argparse.SUPPRESS)


def apply_flags(args: argparse.Namespace, config: dict[str, Any], mixed_precision: str,
                problems: list[str]) -> dict[str, Any]:
    """The launch-config settings these flags give, over the config file's (``config``); problems and
    refusals are appended to ``problems``."""
    for name, why in REFUSED.items():
        if getattr(args, name, None):
            problems.append(why)
    out: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    use_parallelism = bool(getattr(args, "use_parallelism_config", None)) or bool(config.get(_P))
    for name, flag in FLAGS.items():
        raw = getattr(args, name, None)
        if raw is None:
            continue
        if flag.section == _P and not use_parallelism:
            continue  # Accelerate reads the sizes only with --use_parallelism_config
        if flag.section == _F and mixed_precision != "fp8":
            continue  # and the fp8 settings only with fp8 mixed precision
        value, problem = (True, None) if flag.switch else flag.checker(f"--{name}", raw)
        if problem:
            problems.append(problem)
            continue
        if flag.section is None:
            out[flag.key] = value
        else:
            if flag.section not in sections:
                sections[flag.section] = dict(config.get(flag.section) or {})
            sections[flag.section][flag.key] = value
    if mixed_precision == "fp8":
        fp8 = sections.setdefault(_F, dict(config.get(_F) or {}))
        for key, default in FP8_DEFAULTS.items():
            fp8.setdefault(key, default)
    if getattr(args, "use_parallelism_config", None):
        parallel = sections.setdefault(_P, dict(config.get(_P) or {}))
        for key, default in PARALLELISM_DEFAULTS.items():
            parallel.setdefault(key, default)
    if _P in sections:
        parallel = sections[_P]
        if int(parallel.get("sp_size", 1)) > 1:
            problems.append(f"--parallelism_config_sp_size {parallel['sp_size']}: DeepSpeed sequence parallelism "
                            "(Ulysses) is not supported; use context parallelism (--parallelism_config_cp_size)")
        # the keys overdrive's ParallelismConfig does not take travel as Accelerate's variables only
        extras = {key: parallel.pop(key) for key in list(parallel) if not key.startswith("parallelism_config_")}
        if int(parallel.get("parallelism_config_cp_size", 1)) > 1:
            extras.setdefault("cp_comm_strategy", "allgather")
        else:
            extras.pop("cp_comm_strategy", None)  # Accelerate exports it only with context parallelism
        out["parallelism_variables"] = {**PARALLELISM_EXTRAS, **extras}
    if out.get("enable_cpu_affinity"):
        out["cpu_affinity"] = True
    offload = getattr(args, "fsdp_activation_checkpointing_offload", None)
    if offload is not None and cf._bool("--fsdp_activation_checkpointing_offload", offload)[0] is True:
        problems.append("--fsdp_activation_checkpointing_offload: offloading checkpointed activations to the CPU is "
                        "not supported; use --fsdp_activation_checkpointing alone")
    return {**out, **sections}
