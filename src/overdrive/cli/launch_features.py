"""The features' flags of ``overdrive launch`` (the rest of ``accelerate launch``'s flags), carried out:
compile, fp8, the parallelism config, TPU, SageMaker, MPI and Megatron-LM, each with Accelerate's meaning. The
flags themselves (names, kinds, help, refusals) are settings of the schema, ``overdrive.launchers.settings``;
any setting with a flag and a config file key outside the launcher's own groups is carried out here, so a new
setting needs no code in this module.

A flag given lands in the launch config the workers read, under the config file's key (``dynamo_config``,
``fp8_config``, ``parallelism_config`` or the top level), so flag and file mean the same; the launcher then
exports Accelerate's variables for it (``overdrive.launchers.accelerate_variables.variables_for_workers``). A
flag whose feature overdrive does not have is accepted by the parser and refused, naming it, when given.
Nothing here imports torch: ``overdrive launch`` checks its arguments before it loads torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from overdrive.launchers.setting_kinds import Bool
from overdrive.launchers.settings import Setting, current, section_defaults

_D, _F, _P = "dynamo_config", "fp8_config", "parallelism_config"
#: the groups whose settings ``overdrive launch`` reads itself (cli/launch.py) rather than here
_LAUNCH_GROUPS = ("launch", "hardware", "resources", "machines", "deepspeed", "fsdp", "megatron")


def feature_settings() -> list[Setting]:
    """The settings carried out here: config file settings with a flag, outside the launcher's own groups,
    not refused (a new setting of the schema is one of them)."""
    return [s for s in current() if s.group not in _LAUNCH_GROUPS and s.flag_name and s.yaml_key and not s.refused]


#: the fp8 settings Accelerate's launcher exports with fp8 mixed precision when not given (its flags' defaults)
FP8_DEFAULTS = section_defaults(_F)
_PARALLEL = section_defaults(_P)
#: the parallelism sizes Accelerate always exports with --use_parallelism_config (its flags' defaults)
PARALLELISM_DEFAULTS = {k: v for k, v in _PARALLEL.items() if k.startswith("parallelism_config_")}
#: the parallelism settings that are not sizes: exported as Accelerate does, not read by overdrive's workers
PARALLELISM_EXTRAS = {k: v for k, v in _PARALLEL.items() if k not in PARALLELISM_DEFAULTS}


def apply_flags(args: argparse.Namespace, config: dict[str, Any], mixed_precision: str,
                problems: list[str]) -> dict[str, Any]:
    """The launch-config settings these flags give, over the config file's (``config``); problems and
    refusals are appended to ``problems``."""
    for setting in current():
        if setting.refused and getattr(args, setting.name, None):
            problems.append(setting.refused)
    out: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    use_parallelism = bool(getattr(args, "use_parallelism_config", None)) or bool(config.get(_P))
    for flag in feature_settings():
        raw = getattr(args, flag.name, None)
        section, key = flag.place
        if raw is None:
            if section is None and flag.yaml_key in config:  # the file's value (its sections are read whole)
                out[key] = config[str(flag.yaml_key)]
            continue
        if section == _P and not use_parallelism:
            continue  # Accelerate reads the sizes only with --use_parallelism_config
        if section == _F and mixed_precision != "fp8":
            continue  # and the fp8 settings only with fp8 mixed precision
        value, problem = flag.check(f"--{flag.flag_name}", raw)
        if problem:
            problems.append(problem)
            continue
        if section is None:
            out[key] = value
        else:
            if section not in sections:
                sections[section] = dict(config.get(section) or {})
            sections[section][key] = value
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
    offload = getattr(args, "fsdp_activation_checkpointing_offload", None)
    if offload is not None and Bool().check("--fsdp_activation_checkpointing_offload", offload)[0] is True:
        problems.append("--fsdp_activation_checkpointing_offload: offloading checkpointed activations to the CPU is "
                        "not supported; use --fsdp_activation_checkpointing alone")
    return {**out, **sections}
