"""``overdrive launch``: Accelerate's launch flags, a config file and defaults -> one plan -> torchrun.

A flag beats the config file, which beats the default. Every problem is reported at once, each naming
the value, where it came from (the flag or the file and key) and the valid choices.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overdrive.cli import Parser, UsageError, add_setting_flag, launch_features
from overdrive.cli.launch_checks import (
    Value,
    check_together,
    check_value,
    command_of,
    dynamo_backend,
    flag_value,
    lighthouse_problems,
    machine_range,
    missing_packages,
    plugin_sections,
)
from overdrive.cli.launch_trackers import tracker_problems
from overdrive.launchers import config_file as cf
from overdrive.launchers.launch_plan import Command, LaunchPlan, default_threads
from overdrive.launchers.settings import GROUPS, Setting, by_name, current
from overdrive.runtime.cluster import launch_defaults

# config file keys handed to the workers as they are, when the file has them (the other settings of the file
# reach them through launch_features.apply_flags, over the flags)
PASSTHROUGH = ("distributed_type", "dynamo_config", "fsdp_config", "deepspeed_config", "megatron_lm_config",
               "fp8_config", "parallelism_config", "ipex_config")

DEVICE_VARIABLES = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK", "npu": "ASCEND_RT_VISIBLE_DEVICES",
                    "mlu": "MLU_VISIBLE_DEVICES", "musa": "MUSA_VISIBLE_DEVICES", "hpu": "HABANA_VISIBLE_MODULES"}


def add_launch_flags(parser: argparse.ArgumentParser, settings: Sequence[Setting] | None = None) -> None:
    """Accelerate's launch flags (both spellings), one per setting of the schema that has a flag, in the
    schema's groups; every default is None so a given flag can be told apart."""
    groups: dict[str, argparse._ActionsContainer] = {}
    for key, title in GROUPS.items():
        groups[key] = parser.add_argument_group(title) if title else parser
    for setting in current(settings):
        if setting.flag_name:
            add_setting_flag(groups[setting.group], setting)
    for spelling in ("--no_tpu_cluster", "--no-tpu-cluster"):  # Accelerate's negation of --tpu_cluster
        groups["other"].add_argument(spelling, dest="tpu_use_cluster", action="store_false", help=argparse.SUPPRESS)


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


def read_config(args: argparse.Namespace) -> tuple[dict[str, Any], cf.ConfigSource]:
    """The config file launch reads (``--config_file``, else the default one, if any) and where it came from.

    Returns ``({}, source)`` when there is none. Raises ``UsageError`` for a file that is invalid, or
    missing when ``--config_file`` named it."""
    source = cf.find_config(flag_value(args, "config_file"))
    if source.path is None:
        return {}, source
    try:
        return cf.load_config(source.path), source
    except cf.ConfigError as err:
        if source.reason == "--config_file" and err.problems == ["the file does not exist"]:
            raise UsageError(f"--config_file {source.path}: the file does not exist") from None
        raise UsageError([str(err)]) from None


def _device() -> tuple[str | None, int]:
    import torch  # lazy: the first pass refuses bad arguments before torch loads

    if not torch.accelerator.is_available():
        return None, 0
    accelerator = torch.accelerator.current_accelerator()
    return (accelerator.type if accelerator else None), torch.accelerator.device_count()


def plan_launch(args: argparse.Namespace) -> tuple[LaunchPlan, Command, str]:
    """The plan for ``args`` (flags > a cluster manager's variables for the machine settings, see
    ``runtime.cluster.launch_defaults`` > config file > defaults), what each worker runs, and the one line
    that says what will run. Raises ``UsageError`` listing every problem.

    Two passes: the first knows nothing of the devices and imports no torch (a mistyped value is refused
    at once, not after torch's import, which takes seconds); the second finds the devices and checks what
    depends on them (the default process count, fp8 on this GPU)."""
    _plan(args, device=None)
    plan = _plan(args, device=_device())
    assert plan is not None
    return plan


@dataclass(frozen=True)
class _Place:
    """Where the workers run: the device type and count found (None, 0 in the first pass or without one),
    whether the CPU was asked for, whether the CPU is used, and whether each process trains alone (multi-GPU
    asked for on a machine without a GPU, as Accelerate's launcher then does)."""

    device_type: str | None
    device_count: int
    forced_cpu: bool
    cpu: bool
    alone: bool

    @classmethod
    def find(cls, args: argparse.Namespace, config: dict[str, Any], device: tuple[str | None, int] | None) -> _Place:
        device_type, device_count = device or (None, 0)
        forced_cpu = bool(flag_value(args, "cpu")) or (not flag_value(args, "multi_gpu") and (
            config.get("use_cpu") is True or config.get("distributed_type") == "MULTI_CPU"))
        alone = device is not None and device_type is None and not forced_cpu and _asks_multi_gpu(args, config)
        return cls(device_type, device_count, forced_cpu, forced_cpu or device_type is None, alone)


class _Picker:
    """One setting's value and where it came from: the flag, else a cluster manager's variable (the machine
    settings under SLURM / Kubeflow: ``runtime.cluster.launch_defaults``), else the config file, else the
    default. A bad flag value is added to ``problems``."""

    def __init__(self, args: argparse.Namespace, config: dict[str, Any], source: cf.ConfigSource,
                 problems: list[str]) -> None:
        self.args, self.config, self.source, self.problems = args, config, source, problems
        self.settings = by_name()
        self.cluster, self.cluster_source = launch_defaults(os.environ)

    def __call__(self, name: str, default: Any = None) -> Value:
        setting = self.settings[name]
        default = setting.default if default is None else default
        flag = flag_value(self.args, name)
        if flag is not None:
            value = check_value(setting, f"--{setting.flag_name}", flag, self.problems)
            if value != -1:  # num_processes -1: Accelerate's "not set"
                return Value(value, f"--{setting.flag_name}")
        if name in self.cluster:
            return Value(self.cluster[name], self.cluster_source)
        key = setting.yaml_key
        if key and key in self.config and self.config[key] is not None and self.config[key] != -1:
            return Value(self.config[key], f"{self.source.path} ({key})")
        return Value(default, "default")


@dataclass(frozen=True)
class _Picked:
    """The launcher's own settings, each with where it came from."""

    num_processes: Value
    machines: Value  # as given: N, or MIN:MAX for an elastic job
    min_machines: int
    num_machines: Value
    machine_rank: Value
    ip: Value
    port: Value
    rdzv: Value
    rdzv_conf: Value
    same_network: Value
    restarts: Value
    interval: Value
    gpu_ids: Value
    precision: Value
    accumulation: Value
    threads: Value
    debug: Value
    timeout: Value
    stall: Value
    dynamo: str


def _pick_settings(pick: _Picker, place: _Place) -> _Picked:
    """Every setting the launcher reads itself; the number of processes defaults to one per GPU."""
    args, problems = pick.args, pick.problems
    given = flag_value(args, "num_machines")  # MIN:MAX (elastic) is overdrive's own form: not the schema's integer
    machines = Value(given, "--num_machines") if given is not None and ":" in str(given) else pick("num_machines")
    min_machines, num_machines = machine_range(machines, problems)
    return _Picked(
        num_processes=pick("num_processes", place.device_count if not place.cpu and place.device_count else 1),
        machines=machines, min_machines=min_machines, num_machines=num_machines,
        machine_rank=pick("machine_rank"), ip=pick("main_process_ip"), port=pick("main_process_port"),
        rdzv=pick("rdzv_backend"), rdzv_conf=pick("rdzv_conf"), same_network=pick("same_network"),
        restarts=pick("max_restarts"), interval=pick("monitor_interval"), gpu_ids=pick("gpu_ids"),
        precision=pick("mixed_precision"), accumulation=pick("gradient_accumulation_steps"),
        threads=pick("num_cpu_threads_per_process"), debug=pick("debug"), timeout=pick("timeout"),
        stall=pick("stall_timeout"), dynamo=dynamo_backend(args, pick.config, problems))


def _precision_problems(picked: _Picked, args: argparse.Namespace, config: dict[str, Any], place: _Place,
                        first_pass: bool) -> list[str]:
    """A missing optional package (first pass), or fp8 this machine cannot run: refused once, here, not in
    every worker."""
    precision = picked.precision
    if first_pass:
        return missing_packages(precision.value, bool(flag_value(args, "use_deepspeed")), config, picked.rdzv)
    if precision.value != "fp8":
        return []
    from overdrive.precision.fp8 import fp8_unavailable  # lazy: it imports torch (second pass only)

    backend = flag_value(args, "fp8_backend") or (config.get("fp8_config") or {}).get("backend")
    problem = fp8_unavailable(backend, "cpu" if place.cpu else place.device_type)
    return [f"{precision.source}: mixed_precision 'fp8': {problem}"] if problem else []


def _machine_problems(picked: _Picked, args: argparse.Namespace, config: dict[str, Any], first_pass: bool,
                      problems: list[str]) -> None:
    """The process and machine counts together, and an elastic job's rendezvous."""
    if not problems and (not first_pass or picked.num_processes.source != "default"):
        # fault-tolerant machines never meet in one rendezvous: each is a replica group on its own
        fault_tolerant = bool(flag_value(args, "ft_lighthouse") or config.get("ft_lighthouse"))
        check_together(picked.num_processes, picked.num_machines, picked.machine_rank,
                        Value("-", "") if fault_tolerant else picked.ip, problems)
    if picked.min_machines != picked.num_machines.value and picked.rdzv.value == "static":
        problems.append(f"num_machines {picked.min_machines}:{picked.num_machines.value} (from "
                        f"{picked.machines.source}) is elastic: it needs torchrun's dynamic rendezvous: add "
                        f"--rdzv_backend c10d (or etcd-v2, with an etcd server; rdzv_backend static, from "
                        f"{picked.rdzv.source}), or give one number of machines")


def _plan(args: argparse.Namespace, device: tuple[str | None, int] | None
          ) -> tuple[LaunchPlan, Command, str] | None:
    """``plan_launch``'s pass: with ``device`` None, only the checks that need no torch (returns None)."""
    config, source = read_config(args)
    problems: list[str] = []
    pick = _Picker(args, config, source, problems)
    place = _Place.find(args, config, device)
    picked = _pick_settings(pick, place)
    problems += _precision_problems(picked, args, config, place, first_pass=device is None)
    _machine_problems(picked, args, config, device is None, problems)
    plugin_config = plugin_sections(args, config, source, problems)
    feature_config = launch_features.apply_flags(args, config, str(picked.precision.value), problems)
    command = command_of(args, problems)
    guesses: list[str] = []
    if device is None and command.target and not command.no_python:  # a missing tracker package, named once
        certain, guesses = tracker_problems(None if command.module else command.target, command.args)
        problems += certain
    if feature_config.get("ft_lighthouse") and not problems:
        problems += lighthouse_problems(str(feature_config["ft_lighthouse"]))
    if problems:
        raise UsageError(problems)
    if device is None:
        if not flag_value(args, "quiet"):
            for line in guesses:  # read from the source, which may never run it: a warning, not a refusal
                print(f"overdrive launch: warning: {line}", file=sys.stderr, flush=True)
        return None
    worker_config = _worker_config(picked, place, config, source, {**plugin_config, **feature_config})
    plan = _launch_plan(picked, place, worker_config, args)
    return plan, command, _summary_line(plan, place, args, source)


def _worker_config(picked: _Picked, place: _Place, config: dict[str, Any], source: cf.ConfigSource,
                   flags_config: dict[str, Any]) -> dict[str, Any]:
    """The launch config every worker reads: the config file's sections, the flags' settings over them, and
    the launcher's own settings."""
    local = picked.num_processes.value // picked.num_machines.value
    settings = by_name()
    keys = {name: settings[name].yaml_key for name in PASSTHROUGH}
    worker_config = {name: config[key] for name, key in keys.items() if key in config}
    worker_config.update(flags_config)
    threads = picked.threads.value or _inherited_threads() or default_threads(local)
    worker_config.update(
        cpu=place.cpu and not place.alone, mixed_precision=picked.precision.value,
        gradient_accumulation_steps=picked.accumulation.value, dynamo_backend=picked.dynamo,
        debug=picked.debug.value, num_processes=picked.num_processes.value, num_machines=picked.num_machines.value,
        machine_rank=picked.machine_rank.value, main_process_ip=picked.ip.value, main_process_port=picked.port.value,
        rdzv_backend=picked.rdzv.value, same_network=picked.same_network.value, gpu_ids=picked.gpu_ids.value,
        num_cpu_threads_per_process=threads, config_file=str(source.path) if source.path else None)
    if picked.timeout.value is not None:
        worker_config["timeout"] = picked.timeout.value
    if picked.stall.value is not None:
        worker_config["stall_timeout"] = picked.stall.value
    if worker_config.get("ft_lighthouse"):  # each machine is one replica group
        worker_config.setdefault("ft_replica_group", picked.machine_rank.value)
        worker_config.setdefault("ft_num_replica_groups", picked.num_machines.value)
    return worker_config


def _launch_plan(picked: _Picked, place: _Place, worker_config: dict[str, Any],
                 args: argparse.Namespace) -> LaunchPlan:
    """The plan torchrun runs on this machine; a fault-tolerant machine runs its own torchrun, on itself."""
    visible = {}
    if not place.cpu and picked.gpu_ids.value != "all" and place.device_type in DEVICE_VARIABLES:
        visible[DEVICE_VARIABLES[place.device_type]] = picked.gpu_ids.value
    machines = (picked.num_processes.value, picked.num_machines.value, picked.machine_rank.value, picked.ip.value,
                picked.min_machines)
    if worker_config.get("ft_lighthouse"):
        machines = (picked.num_processes.value // picked.num_machines.value, 1, 0, "127.0.0.1", 1)
    processes, num_machines, machine_rank, ip, min_machines = machines
    return LaunchPlan(
        num_processes=processes, num_machines=num_machines, machine_rank=machine_rank, main_process_ip=ip,
        main_process_port=picked.port.value, rdzv_backend=picked.rdzv.value, min_machines=min_machines,
        rdzv_conf=picked.rdzv_conf.value or "", max_restarts=picked.restarts.value,
        monitor_interval=picked.interval.value, num_cpu_threads_per_process=picked.threads.value,
        visible_devices=visible, worker_config=worker_config, log_dir=flag_value(args, "log_dir"),
        tee=flag_value(args, "tee"), role=flag_value(args, "role") or "default", debug=bool(picked.debug.value),
        quiet=bool(flag_value(args, "quiet")))


def _summary_line(plan: LaunchPlan, place: _Place, args: argparse.Namespace, source: cf.ConfigSource) -> str:
    """The one line that says what will run, with why the CPU is used."""
    if place.alone and plan.num_processes > 1:
        return (f"overdrive launch: starting {plan.processes_per_machine} processes on the CPU, each training alone "
                "(world size 1): multi-GPU was asked for on a machine with no GPU, and accelerate launch does the "
                "same; add --cpu to train them as one run on gloo" + (f"; config: {source.path}" if source.path else ""))
    if place.device_type is None:
        cpu_reason = " (no GPU found)"
    elif flag_value(args, "cpu"):
        cpu_reason = " (--cpu)"
    else:
        cpu_reason = " (the config file asks for the CPU)" if place.forced_cpu else ""
    return _summary(plan, place.cpu, cpu_reason, place.device_type, source)


def _asks_multi_gpu(args: argparse.Namespace, config: dict[str, Any]) -> bool:
    """Whether ``--multi_gpu`` or, with no other kind given by a flag, the config file's ``distributed_type``
    asks for one process per GPU (Accelerate's launcher then starts its workers without the CPU setting)."""
    if flag_value(args, "multi_gpu"):
        return True
    others = ("use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu")
    return not any(flag_value(args, name) for name in others) and config.get("distributed_type") == "MULTI_GPU"


def _inherited_threads() -> int | None:
    """OMP_NUM_THREADS of this shell, which the workers keep when no thread count is asked for."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _summary(plan: LaunchPlan, cpu: bool, cpu_reason: str, device_type: str | None,
             source: cf.ConfigSource) -> str:
    local = plan.processes_per_machine
    noun = "process" if local == 1 else "processes"
    backend = " on gloo" if plan.num_processes > 1 else ""  # one process joins no process group
    what = f"{local} CPU {noun}{backend}{cpu_reason}" if cpu else f"{local} {noun} on {device_type}"
    line = f"overdrive launch: starting {what}"
    if plan.min_machines != plan.num_machines:
        line += (f" on each of {plan.min_machines} to {plan.num_machines} machines (elastic), up to "
                 f"{plan.num_processes} in all, meeting at {plan.main_process_ip}:{plan.main_process_port or 29500} "
                 f"({plan.rdzv_backend} rendezvous)")
    elif plan.num_machines > 1:
        line += (f" on machine {plan.machine_rank} of {plan.num_machines}, {plan.num_processes} in all, meeting at "
                 f"{plan.main_process_ip}:{plan.main_process_port or 29500} ({plan.rdzv_backend} rendezvous)")
    if source.path:
        line += f"; config: {source.path}"
    return line


def run(args: argparse.Namespace) -> int:
    """``overdrive launch``: resolve the flags and config into a plan, print its summary (unless ``--quiet``)
    and run the script through torchrun; returns the launch's exit status."""
    plan, command, summary = plan_launch(args)
    # lazy: the launcher's machinery (subprocess, the failure report) loads once the arguments are accepted
    from overdrive.launchers.torchrun import launch_script

    if not plan.quiet:
        print(summary, file=sys.stderr, flush=True)
        if not command.as_accelerate and not command.no_python and not command.module:
            from overdrive.cli.launch_hints import accelerate_line  # lazy: only when the summary is shown

            line = accelerate_line(command.target)
            if line:
                print(line, file=sys.stderr, flush=True)
    return launch_script(plan, command)
