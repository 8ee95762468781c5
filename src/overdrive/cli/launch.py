"""``overdrive launch``: Accelerate's launch flags, a config file and defaults -> one plan -> torchrun.

A flag beats the config file, which beats the default. Every problem is reported at once, each naming
the value, where it came from (the flag or the file and key) and the valid choices.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overdrive.cli import Parser, UsageError, add_flag, launch_extra
from overdrive.launchers import config_file as cf
from overdrive.launchers.torchrun import Command, LaunchPlan, default_threads, launch_script

# launch setting -> config file key (None: a flag only)
CONFIG_KEYS: dict[str, str | None] = {
    "num_processes": "num_processes", "num_machines": "num_machines", "machine_rank": "machine_rank",
    "main_process_ip": "main_process_ip", "main_process_port": "main_process_port",
    "rdzv_backend": "rdzv_backend", "rdzv_conf": "rdzv_conf", "same_network": "same_network",
    "max_restarts": "max_restarts", "monitor_interval": None, "gpu_ids": "gpu_ids",
    "mixed_precision": "mixed_precision", "gradient_accumulation_steps": "gradient_accumulation_steps",
    "num_cpu_threads_per_process": "num_cpu_threads_per_process", "debug": "debug", "timeout": None,
    "stall_timeout": None,
}

# config keys handed to the workers as they are, when the file has them
PASSTHROUGH_KEYS = ("distributed_type", "downcast_bf16", "enable_cpu_affinity", "dynamo_config", "fsdp_config",
                    "deepspeed_config", "megatron_lm_config", "fp8_config", "parallelism_config", "ipex_config",
                    "main_training_function")

DEVICE_VARIABLES = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK", "npu": "ASCEND_RT_VISIBLE_DEVICES",
                    "mlu": "MLU_VISIBLE_DEVICES", "musa": "MUSA_VISIBLE_DEVICES", "hpu": "HABANA_VISIBLE_MODULES"}


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """Accelerate's launch flags (both spellings); every default is None so a given flag can be told apart."""
    add_flag(parser, "config_file", metavar="PATH",
             help="config file to read (default: $OVERDRIVE_CONFIG_FILE or the one 'overdrive config' wrote)")
    add_flag(parser, "quiet", "-q", action="store_true", default=None,
             help="print only the workers' output and failures, no launcher lines")
    add_flag(parser, "debug", action="store_true", default=None,
             help="show torchrun's own log and command, and check collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)")
    add_flag(parser, "module", "-m", action="store_true", default=False,
             help="run the target as a module, like 'python -m'")
    add_flag(parser, "no_python", action="store_true", default=False,
             help="run the target as a program, without 'python' in front")
    add_flag(parser, "as_accelerate", action="store_true", default=False,
             help="run an unmodified Accelerate script (or transformers / PEFT / TRL): 'import accelerate' "
                  "gives overdrive in every worker (overdrive.install_as_accelerate)")
    hw = parser.add_argument_group("hardware")
    add_flag(hw, "cpu", action="store_true", default=None, help="train on the CPU even if there is a GPU")
    add_flag(hw, "multi_gpu", action="store_true", default=None,
             help="one process per GPU (on a machine without GPUs: CPU processes)")
    add_flag(hw, "gpu_ids", metavar="IDS", help="the GPUs of this machine to use, e.g. '0,1' (default: all)")
    res = parser.add_argument_group("resources")
    add_flag(res, "num_processes", metavar="N", help="processes in all, over every machine")
    add_flag(res, "num_machines", metavar="N", help="machines taking part (default 1)")
    add_flag(res, "num_cpu_threads_per_process", metavar="N",
             help="OMP_NUM_THREADS of each worker (default: this machine's cores / its processes)")
    add_flag(res, "mixed_precision", metavar="{" + ",".join(cf.MIXED_PRECISION) + "}")
    add_flag(res, "gradient_accumulation_steps", metavar="N")
    add_flag(res, "dynamo_backend", metavar="BACKEND", help="torch.compile backend: no, inductor, eager, ...")
    dist = parser.add_argument_group("several machines and restarts")
    add_flag(dist, "machine_rank", metavar="RANK", help="this machine's rank, 0 for the main one")
    add_flag(dist, "main_process_ip", metavar="ADDR", help="address of the machine of rank 0")
    add_flag(dist, "main_process_port", metavar="PORT", help="port on the machine of rank 0 (default 29500)")
    add_flag(dist, "same_network", action="store_true", default=None, help="all machines share a local network")
    add_flag(dist, "rdzv_backend", metavar="{" + ",".join(cf.RDZV_BACKENDS) + "}",
             help="torchrun rendezvous: static (default) or c10d")
    add_flag(dist, "rdzv_conf", metavar="K=V,...", help="extra rendezvous settings for torchrun")
    add_flag(dist, "max_restarts", metavar="N", help="restart the whole group up to N times when a process fails")
    add_flag(dist, "monitor_interval", metavar="SECONDS", help="how often the workers are checked (default 0.1)")
    add_flag(dist, "timeout", metavar="SECONDS",
             help="how long a collective waits for every rank before the job ends with a hang report naming the "
                  "rank that did not arrive (default: 180 on the CPU, 600 on GPUs)")
    add_flag(dist, "stall_timeout", metavar="SECONDS",
             help="end the job with every rank's stack when no rank has issued a collective for this long "
                  "(a hang outside collectives, which no timeout catches; default: off)")
    add_flag(dist, "log_dir", metavar="DIR", help="keep each worker's logs here (default: a temporary directory)")
    add_flag(dist, "tee", "-t", metavar="STREAMS",
             help="torchrun's --tee: 1 stdout, 2 stderr, 3 both, to log files and the console with a prefix")
    add_flag(dist, "role", metavar="NAME", default="default", help="torchrun's worker role name")
    _add_plugin_flags(parser)
    launch_extra.add_flags(parser)


def _bool_value(key: str, value: Any) -> tuple[Any, str | None]:
    return cf._bool(key, value)


def _stage(key: str, value: Any) -> tuple[Any, str | None]:
    number, problem = cf._int(minimum=0)(key, value)
    if problem is None and number > 3:
        problem = f"{key}: {number} is not a ZeRO stage; choose 0, 1, 2 or 3"
    return number, problem


def _fsdp_version(key: str, value: Any) -> tuple[Any, str | None]:
    number, problem = cf._int(minimum=1)(key, value)
    if problem is None and number > 2:
        problem = f"{key}: {number} is not valid; choose 1 or 2 (both run on FSDP2)"
    return number, problem


_OFFLOAD = cf._choice(("none", "cpu", "nvme"))
#: DeepSpeed flags -> (checker, help); each is the key of the same name in the config file's deepspeed_config
DEEPSPEED_FLAGS: dict[str, tuple[cf.Checker, str]] = {
    "deepspeed_config_file": (cf._text, "DeepSpeed's JSON config; its \"auto\" values are filled by overdrive"),
    "zero_stage": (_stage, "ZeRO stage: 0, 1, 2 (default) or 3"),
    "offload_optimizer_device": (_OFFLOAD, "offload the optimizer state: none, cpu or nvme (ZeRO 1-3)"),
    "offload_param_device": (_OFFLOAD, "offload the parameters: none, cpu or nvme (ZeRO-3)"),
    "offload_optimizer_nvme_path": (cf._text, "folder for the optimizer offloaded to NVMe"),
    "offload_param_nvme_path": (cf._text, "folder for the parameters offloaded to NVMe"),
    "gradient_clipping": (cf._float, "clip gradients to this global norm (DeepSpeed's default: 1.0; 0: off)"),
    "zero3_init_flag": (_bool_value, "build models already sharded under ZeRO-3 (deepspeed.zero.Init)"),
    "zero3_save_16bit_model": (_bool_value, "ZeRO-3: gather 16-bit weights when DeepSpeed saves the model"),
    "deepspeed_moe_layer_cls_names": (cf._text, "mixture-of-experts layer classes, comma-separated"),
    "deepspeed_multinode_launcher": (cf._text, "accepted for Accelerate: torchrun starts every machine's processes "
                                               "(run overdrive launch on each machine)"),
    "deepspeed_hostfile": (cf._text, "accepted for Accelerate; not used (see --deepspeed_multinode_launcher)"),
    "deepspeed_exclusion_filter": (cf._text, "accepted for Accelerate; not used"),
    "deepspeed_inclusion_filter": (cf._text, "accepted for Accelerate; not used"),
}
#: FSDP flags -> (checker, help); each is the key of the same name in the config file's fsdp_config
FSDP_FLAGS: dict[str, tuple[cf.Checker, str]] = {
    "fsdp_version": (_fsdp_version, "1 or 2 (both run on FSDP2's fully_shard)"),
    "fsdp_sharding_strategy": (cf._text, "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or HYBRID_SHARD_ZERO2"),
    "fsdp_reshard_after_forward": (cf._text, "true (free gathered weights after forward) or false"),
    "fsdp_auto_wrap_policy": (cf._text, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP"),
    "fsdp_transformer_layer_cls_to_wrap": (cf._text, "classes that get their own shard group, comma-separated"),
    "fsdp_min_num_params": (cf._int(minimum=0), "SIZE_BASED_WRAP: parameters of a module with its own group"),
    "fsdp_offload_params": (_bool_value, "keep sharded parameters, gradients and optimizer state on the CPU"),
    "fsdp_state_dict_type": (cf._text, "SHARDED_STATE_DICT or FULL_STATE_DICT"),
    "fsdp_activation_checkpointing": (_bool_value, "recompute each wrapped block's activations in backward"),
    "fsdp_cpu_ram_efficient_loading": (_bool_value, "only rank 0 holds the full weights before sharding"),
    "fsdp_sync_module_states": (_bool_value, "broadcast rank 0's weights before sharding"),
    "fsdp_backward_prefetch": (cf._text, "accepted (an FSDP1 setting; FSDP2 prefetches by itself)"),
    "fsdp_forward_prefetch": (_bool_value, "accepted (an FSDP1 setting)"),
    "fsdp_use_orig_params": (_bool_value, "accepted (an FSDP1 setting)"),
}


def _add_plugin_flags(parser: argparse.ArgumentParser) -> None:
    ds = parser.add_argument_group("DeepSpeed (Accelerate's flags; also the config file's deepspeed_config keys)")
    add_flag(ds, "use_deepspeed", action="store_true", default=None, help="train with DeepSpeed ZeRO")
    for name, (checker, text) in DEEPSPEED_FLAGS.items():
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if checker is _bool_value else {}
        add_flag(ds, name, metavar="VALUE", help=text, **extra)
    fsdp = parser.add_argument_group("FSDP (Accelerate's flags; also the config file's fsdp_config keys)")
    add_flag(fsdp, "use_fsdp", action="store_true", default=None, help="train with fully sharded data parallel")
    for name, (checker, text) in FSDP_FLAGS.items():
        extra = {"nargs": "?", "const": "true"} if checker is _bool_value else {}
        add_flag(fsdp, name, metavar="VALUE", help=text, **extra)


def _plugin_config(args: argparse.Namespace, config: dict[str, Any], source: cf.ConfigSource,
                   problems: list[str]) -> dict[str, Any]:
    """``distributed_type`` and the ``deepspeed_config`` / ``fsdp_config`` the workers get: the config file's,
    with the flags given on top, checked here so that a mistake stops the launch, not every worker."""
    use_deepspeed, use_fsdp = bool(_given(args, "use_deepspeed")), bool(_given(args, "use_fsdp"))
    if use_deepspeed and use_fsdp:
        problems.append("--use_deepspeed and --use_fsdp cannot be used together; choose one")
        return {}
    kind = "DEEPSPEED" if use_deepspeed else "FSDP" if use_fsdp else str(config.get("distributed_type") or "")
    out: dict[str, Any] = {"distributed_type": kind} if use_deepspeed or use_fsdp else {}
    for section, flags, wanted, switch in (("deepspeed_config", DEEPSPEED_FLAGS, "DEEPSPEED", "--use_deepspeed"),
                                           ("fsdp_config", FSDP_FLAGS, "FSDP", "--use_fsdp")):
        given = {name: _given(args, name) for name in flags if _given(args, name) is not None}
        if given and kind != wanted:
            names = ", ".join(f"--{name}" for name in given)
            problems.append(f"{names} {'is a flag' if len(given) == 1 else 'are flags'} of {wanted}: add {switch} "
                            f"(or distributed_type: {wanted} in the config file{f' {source.path}' if source.path else ''})")
            continue
        if kind != wanted:
            continue
        values = dict(config.get(section) or {})
        for name, raw in given.items():
            values[name] = _check(flags[name][0], f"--{name}", raw, problems)
        if values.get("deepspeed_config_file"):  # the workers may start elsewhere
            values["deepspeed_config_file"] = str(Path(values["deepspeed_config_file"]).expanduser().absolute())
        out[section] = values
        problems.extend(_plugin_problems(section, values))
    return out


def _plugin_problems(section: str, values: dict[str, Any]) -> list[str]:
    """What the plugin built from ``values`` in each worker would refuse."""
    from overdrive.config import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    try:
        if section == "fsdp_config":
            FullyShardedDataParallelPlugin.from_config_dict(values)
            return []
        return [f"DeepSpeed: {problem}" for problem in DeepSpeedPlugin.from_config_dict(values).problems()]
    except (ValueError, TypeError, OSError) as exc:
        return [f"{'FSDP' if section == 'fsdp_config' else 'DeepSpeed'}: {exc}"]


def add_parser(sub: Any) -> None:
    """Register ``overdrive launch`` (``accelerate launch``'s flags), the script and its arguments."""
    parser: Parser = sub.add_parser(
        "launch", help="start a training script on several processes or machines",
        description="Start a script on N processes (and machines) through torchrun, with the settings of the "
                    "flags, the config file and the defaults, in that order. Flags take '_' or '-'.",
        allow_abbrev=False)
    add_launch_flags(parser)
    parser.add_argument("training_script", nargs="?", help="the script (or module with -m, program with --no_python)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class Value:
    value: Any
    source: str


def _given(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


def _check(checker: cf.Checker, label: str, raw: Any, problems: list[str]) -> Any:
    value, problem = checker(label, raw)
    if problem:
        problems.append(problem)
    return value


def read_config(args: argparse.Namespace) -> tuple[dict[str, Any], cf.ConfigSource]:
    """The config file launch reads (``--config_file``, else the default one, if any) and where it came from.

    Returns ``({}, source)`` when there is none. Raises ``UsageError`` for a file that is invalid, or
    missing when ``--config_file`` named it."""
    source = cf.find_config(_given(args, "config_file"))
    if source.path is None:
        return {}, source
    try:
        return cf.load_config(source.path), source
    except cf.ConfigError as err:
        if source.reason == "--config_file" and err.problems == ["the file does not exist"]:
            raise UsageError(f"--config_file {source.path}: the file does not exist") from None
        raise UsageError([str(err)]) from None


def _device() -> tuple[str | None, int]:
    import torch

    if not torch.accelerator.is_available():
        return None, 0
    accelerator = torch.accelerator.current_accelerator()
    return (accelerator.type if accelerator else None), torch.accelerator.device_count()


def plan_launch(args: argparse.Namespace) -> tuple[LaunchPlan, Command, str]:
    """The plan for ``args`` (flags > a cluster manager's variables for the machine settings, see
    ``runtime.cluster.launch_defaults`` > config file > defaults), what each worker runs, and the one line
    that says what will run. Raises ``UsageError`` listing every problem.

    Two passes: the first knows nothing of the devices and imports no torch (a mistyped value is refused in
    a fraction of a second, not after torch's 2-10 s import); the second finds the devices and checks what
    depends on them (the default process count, fp8 on this GPU)."""
    _plan(args, device=None)
    plan = _plan(args, device=_device())
    assert plan is not None
    return plan


def _missing_packages(precision: Any, use_deepspeed: bool, config: dict[str, Any]) -> list[str]:
    """Optional packages the launch needs and this environment lacks (found without importing them)."""
    import importlib.util

    problems = []
    deepspeed = use_deepspeed or str(config.get("distributed_type") or "").upper() == "DEEPSPEED"
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        problems.append("DeepSpeed is not installed: pip install deepspeed (or overdrive[deepspeed])")
    if precision == "fp8" and not any(importlib.util.find_spec(name) for name in ("torchao", "transformer_engine")):
        problems.append("mixed_precision 'fp8' needs torchao (pip install torchao, or overdrive[fp8]) or "
                        "Transformer Engine; neither is installed")
    return problems


def _plan(args: argparse.Namespace, device: tuple[str | None, int] | None
          ) -> tuple[LaunchPlan, Command, str] | None:
    """``plan_launch``'s pass: with ``device`` None, only the checks that need no torch (returns None)."""
    config, source = read_config(args)
    problems: list[str] = []
    from overdrive.runtime.cluster import launch_defaults

    cluster, cluster_source = launch_defaults(os.environ)  # one launcher per machine under SLURM / Kubeflow

    def pick(name: str, checker: cf.Checker, default: Any) -> Value:
        flag = _given(args, name)
        if flag is not None:
            return Value(_check(checker, f"--{name}", flag, problems), f"--{name}")
        if name in cluster:
            return Value(cluster[name], cluster_source)
        key = CONFIG_KEYS.get(name)
        if key and key in config and config[key] is not None and not (key == "num_processes" and config[key] == -1):
            return Value(config[key], f"{source.path} ({key})")
        return Value(default, "default")

    device_type, device_count = device or (None, 0)
    forced_cpu = bool(_given(args, "cpu")) or (
        not _given(args, "multi_gpu") and (config.get("use_cpu") is True or config.get("distributed_type") == "MULTI_CPU"))
    cpu = forced_cpu or device_type is None
    num_processes = pick("num_processes", cf._int(minimum=1), device_count if not cpu and device_count else 1)
    num_machines = pick("num_machines", cf._int(minimum=1), 1)
    machine_rank = pick("machine_rank", cf._int(minimum=0), 0)
    ip = pick("main_process_ip", cf._text, None)
    port = pick("main_process_port", cf._int(minimum=1), None)
    rdzv = pick("rdzv_backend", cf._choice(cf.RDZV_BACKENDS), "static")
    rdzv_conf = pick("rdzv_conf", cf._text, "")
    same_network = pick("same_network", cf._bool, False)
    restarts = pick("max_restarts", cf._int(minimum=0), 0)
    interval = pick("monitor_interval", cf._float, 0.1)
    gpu_ids = pick("gpu_ids", cf._gpu_ids, "all")
    precision = pick("mixed_precision", cf._choice(cf.MIXED_PRECISION), "no")
    if device is None:
        problems += _missing_packages(precision.value, bool(_given(args, "use_deepspeed")), config)
    elif precision.value == "fp8":  # a missing package or GPU fails here once, not in every worker
        from overdrive.precision.fp8 import fp8_unavailable

        backend = _given(args, "fp8_backend") or (config.get("fp8_config") or {}).get("backend")
        fp8_problem = fp8_unavailable(backend, "cpu" if cpu else device_type)
        if fp8_problem:
            problems.append(f"{precision.source}: mixed_precision 'fp8': {fp8_problem}")
    accumulation = pick("gradient_accumulation_steps", cf._int(minimum=1), 1)
    threads = pick("num_cpu_threads_per_process", cf._int(minimum=1), None)
    debug = pick("debug", cf._bool, False)
    timeout = pick("timeout", cf._float, None)
    if timeout.value is not None and not timeout.value > 0:
        problems.append(f"--timeout {timeout.value}: give a number of seconds above 0")
    stall = pick("stall_timeout", cf._float, None)
    if stall.value is not None and not stall.value > 0:
        problems.append(f"--stall_timeout {stall.value}: give a number of seconds above 0")
    dynamo = _dynamo_backend(args, config, source, problems)

    if not problems and (device is not None or num_processes.source != "default"):
        _check_together(num_processes, num_machines, machine_rank, ip, port, interval, problems)
    plugin_config = _plugin_config(args, config, source, problems)
    extra_config = launch_extra.apply_flags(args, config, str(precision.value), problems)
    command = _command(args, problems)
    if problems:
        raise UsageError(problems)
    if device is None:
        return None

    local = num_processes.value // num_machines.value
    visible = {}
    if not cpu and gpu_ids.value != "all" and device_type in DEVICE_VARIABLES:
        visible[DEVICE_VARIABLES[device_type]] = gpu_ids.value
    worker_config = {key: config[key] for key in PASSTHROUGH_KEYS if key in config}
    worker_config.update(plugin_config)
    worker_config.update(extra_config)
    worker_config.update(
        cpu=cpu, mixed_precision=precision.value, gradient_accumulation_steps=accumulation.value,
        dynamo_backend=dynamo, debug=debug.value, num_processes=num_processes.value,
        num_machines=num_machines.value, machine_rank=machine_rank.value, main_process_ip=ip.value,
        main_process_port=port.value, rdzv_backend=rdzv.value, same_network=same_network.value,
        gpu_ids=gpu_ids.value, num_cpu_threads_per_process=threads.value or _inherited_threads() or default_threads(local),
        config_file=str(source.path) if source.path else None,
    )
    if timeout.value is not None:
        worker_config["timeout"] = timeout.value
    if stall.value is not None:
        worker_config["stall_timeout"] = stall.value
    plan = LaunchPlan(
        num_processes=num_processes.value, num_machines=num_machines.value, machine_rank=machine_rank.value,
        main_process_ip=ip.value, main_process_port=port.value, rdzv_backend=rdzv.value,
        rdzv_conf=rdzv_conf.value or "", max_restarts=restarts.value, monitor_interval=interval.value,
        num_cpu_threads_per_process=threads.value, visible_devices=visible, worker_config=worker_config,
        log_dir=_given(args, "log_dir"), tee=_given(args, "tee"), role=_given(args, "role") or "default",
        debug=bool(debug.value), quiet=bool(_given(args, "quiet")),
    )
    if device_type is None:
        cpu_reason = " (no GPU found)"
    elif _given(args, "cpu"):
        cpu_reason = " (--cpu)"
    else:
        cpu_reason = " (the config file asks for the CPU)" if forced_cpu else ""
    return plan, command, _summary(plan, cpu, cpu_reason, device_type, source)


def _inherited_threads() -> int | None:
    """OMP_NUM_THREADS of this shell, which the workers keep when no thread count is asked for."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _dynamo_backend(args: argparse.Namespace, config: dict[str, Any], source: cf.ConfigSource,
                    problems: list[str]) -> str:
    flag = _given(args, "dynamo_backend")
    if flag is not None:
        return str(_check(cf._choice(cf.DYNAMO_BACKENDS), "--dynamo_backend", flag, problems))
    backend = (config.get("dynamo_config") or {}).get("dynamo_backend")
    return str(backend).lower() if backend else "no"


def _check_together(num_processes: Value, num_machines: Value, machine_rank: Value, ip: Value, port: Value,
                    interval: Value, problems: list[str]) -> None:
    if num_processes.value % num_machines.value:
        problems.append(
            f"num_processes {num_processes.value} (from {num_processes.source}) is the number of processes over all "
            f"machines and must divide evenly among num_machines {num_machines.value} (from {num_machines.source}); "
            f"for {num_machines.value} machines try {num_machines.value * max(num_processes.value // num_machines.value, 1)}")
    if machine_rank.value >= num_machines.value:
        problems.append(f"machine_rank {machine_rank.value} (from {machine_rank.source}) must be below num_machines "
                        f"{num_machines.value} (from {num_machines.source}): ranks run 0..{num_machines.value - 1}")
    if num_machines.value > 1 and not ip.value:
        problems.append(f"num_machines {num_machines.value} (from {num_machines.source}) needs --main_process_ip, the "
                        "address of the machine of rank 0, on every machine")
    if port.value is not None and not 0 < port.value < 65536:
        problems.append(f"main_process_port {port.value} (from {port.source}) is not a port; give 1-65535")
    if not interval.value > 0:
        problems.append(f"monitor_interval {interval.value} (from {interval.source}) must be more than 0 seconds")


def _command(args: argparse.Namespace, problems: list[str]) -> Command:
    target = args.training_script
    if not target:
        problems.append("no training script given: overdrive launch [FLAGS] SCRIPT.py [SCRIPT ARGS] "
                        "(or -m MODULE, or --no_python PROGRAM)")
        return Command(target="")
    command = Command(target=target, args=tuple(args.training_script_args), module=bool(args.module),
                      no_python=bool(args.no_python), as_accelerate=bool(getattr(args, "as_accelerate", False)))
    if command.as_accelerate and command.no_python:
        problems.append("--as_accelerate needs a python script or module (-m): it cannot alias imports in a program "
                        "started with --no_python")
    if command.module and command.no_python:
        problems.append("-m/--module and --no_python cannot be used together: a module needs python")
    elif command.no_python:
        if shutil.which(target) is None:
            problems.append(f"program {target!r} (--no_python) was not found on PATH or is not executable")
    elif not command.module:
        path = Path(target)
        if not path.is_file():
            where = f" (looked in {os.getcwd()})" if not path.is_absolute() else ""
            names = [p.name for p in path.parent.iterdir() if p.suffix == ".py"] if path.parent.is_dir() else []
            problems.append(f"training script {target!r} does not exist{where}{cf.nearest(path.name, names, 0.8)}")
    return command


def _summary(plan: LaunchPlan, cpu: bool, cpu_reason: str, device_type: str | None,
             source: cf.ConfigSource) -> str:
    local = plan.processes_per_machine
    noun = "process" if local == 1 else "processes"
    what = f"{local} CPU {noun} on gloo{cpu_reason}" if cpu else f"{local} {noun} on {device_type}"
    line = f"overdrive launch: starting {what}"
    if plan.num_machines > 1:
        line += (f" on machine {plan.machine_rank} of {plan.num_machines}, {plan.num_processes} in all, meeting at "
                 f"{plan.main_process_ip}:{plan.main_process_port or 29500} ({plan.rdzv_backend} rendezvous)")
    if source.path:
        line += f"; config: {source.path}"
    return line


def run(args: argparse.Namespace) -> int:
    """``overdrive launch``: resolve the flags and config into a plan, print its summary (unless ``--quiet``)
    and run the script through torchrun; returns the launch's exit status."""
    plan, command, summary = plan_launch(args)
    if not plan.quiet:
        print(summary, file=sys.stderr, flush=True)
    return launch_script(plan, command)
