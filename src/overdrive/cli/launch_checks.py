"""The checks of ``overdrive launch``'s arguments that stand alone: the script or program, the machines and
processes together, an elastic range, the plugin sections, the optional packages a launch needs and a
fault-tolerant launch's lighthouse. Each adds what is wrong to a list of problems, naming the value, where it
came from and the valid choices, so that every problem is reported at once. None imports torch."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overdrive.launchers import config_file as cf
from overdrive.launchers.launch_plan import Command
from overdrive.launchers.settings import Setting, by_name, current

#: the plugin sections whose flags need their switch: section -> (distributed_type, switch flag)
PLUGIN_SECTIONS = {"deepspeed_config": ("DEEPSPEED", "--use_deepspeed"), "fsdp_config": ("FSDP", "--use_fsdp")}


@dataclass(frozen=True)
class Value:
    """A setting's value and where it came from (``--flag``, ``FILE (key)``, a cluster variable, ``default``)."""

    value: Any
    source: str


def flag_value(args: argparse.Namespace, name: str) -> Any:
    """The flag ``name`` as given on the command line, None when it was not."""
    return getattr(args, name, None)


def check_value(setting: Setting, label: str, raw: Any, problems: list[str]) -> Any:
    """``raw`` checked by ``setting``'s kind under ``label``; a problem is added to ``problems``."""
    value, problem = setting.check(label, raw)
    if problem:
        problems.append(problem)
    return value


def plugin_sections(args: argparse.Namespace, config: dict[str, Any], source: cf.ConfigSource,
                    problems: list[str]) -> dict[str, Any]:
    """``distributed_type`` and the ``deepspeed_config`` / ``fsdp_config`` the workers get: the config file's,
    with the flags given on top, checked here so that a mistake stops the launch, not every worker."""
    use_deepspeed, use_fsdp = bool(flag_value(args, "use_deepspeed")), bool(flag_value(args, "use_fsdp"))
    if use_deepspeed and use_fsdp:
        problems.append("--use_deepspeed and --use_fsdp cannot be used together; choose one")
        return {}
    kind = "DEEPSPEED" if use_deepspeed else "FSDP" if use_fsdp else str(config.get("distributed_type") or "")
    out: dict[str, Any] = {"distributed_type": kind} if use_deepspeed or use_fsdp else {}
    for section, (wanted, switch) in PLUGIN_SECTIONS.items():
        given = {s: flag_value(args, s.name) for s in current()
                 if s.flag_name and s.place[0] == section and flag_value(args, s.name) is not None}
        if given and kind != wanted:
            names = ", ".join(f"--{s.flag_name}" for s in given)
            problems.append(f"{names} {'is a flag' if len(given) == 1 else 'are flags'} of {wanted}: add {switch} "
                            f"(or distributed_type: {wanted} in the config file{f' {source.path}' if source.path else ''})")
            continue
        if kind != wanted:
            continue
        values = dict(config.get(section) or {})
        for setting, raw in given.items():
            values[setting.place[1]] = check_value(setting, f"--{setting.flag_name}", raw, problems)
        if values.get("deepspeed_config_file"):  # the workers may start elsewhere
            values["deepspeed_config_file"] = str(Path(values["deepspeed_config_file"]).expanduser().absolute())
        out[section] = values
        problems.extend(plugin_problems(section, values))
    return out


def plugin_problems(section: str, values: dict[str, Any]) -> list[str]:
    """What the plugin built from ``values`` in each worker would refuse."""
    # lazy: the plugin dataclasses load only for a launch with a plugin section
    from overdrive.config import FullyShardedDataParallelPlugin
    from overdrive.strategies.deepspeed import DeepSpeedPlugin

    try:
        if section == "fsdp_config":
            FullyShardedDataParallelPlugin.from_config_dict(values)
            return []
        return [f"DeepSpeed: {problem}" for problem in DeepSpeedPlugin.from_config_dict(values).problems()]
    except (ValueError, TypeError, OSError) as exc:
        return [f"{'FSDP' if section == 'fsdp_config' else 'DeepSpeed'}: {exc}"]


def missing_packages(precision: Any, use_deepspeed: bool, config: dict[str, Any], rdzv: Value) -> list[str]:
    """Optional packages the launch needs and this environment lacks (found without importing them)."""
    problems = []
    deepspeed = use_deepspeed or str(config.get("distributed_type") or "").upper() == "DEEPSPEED"
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        problems.append("DeepSpeed is not installed: pip install deepspeed (or overdrive[deepspeed])")
    if precision == "fp8" and not any(importlib.util.find_spec(name) for name in ("torchao", "transformer_engine")):
        problems.append("mixed_precision 'fp8' needs torchao (pip install torchao, or overdrive[fp8]) or "
                        "Transformer Engine; neither is installed")
    if rdzv.value in ("etcd", "etcd-v2") and importlib.util.find_spec("etcd") is None:
        problems.append(f"rdzv_backend {rdzv.value} (from {rdzv.source}): torchrun's etcd rendezvous needs the "
                        "python-etcd package: pip install python-etcd (or overdrive[ft])")
    return problems


def lighthouse_problems(address: str) -> list[str]:
    """A fault-tolerant launch is refused when nothing answers at its lighthouse."""
    from overdrive.cli.lighthouse import check_lighthouse  # lazy: only a fault-tolerant launch asks (socket)

    why = check_lighthouse(address)
    if why is None:
        return []
    return [f"--ft_lighthouse {address}: no lighthouse answers there ({why}); start one with 'overdrive lighthouse "
            "--min_replicas N' on a machine every replica group can reach, and give the address it prints"]


def machine_range(machines: Value, problems: list[str]) -> tuple[int, Value]:
    """``(MIN, MAX)`` of the number of machines: ``--num_machines MIN:MAX`` (or an elastic Kubeflow job's
    ``PET_NNODES``) for an elastic job, else one number for both."""
    low, sep, high = str(machines.value).strip().partition(":")
    if not sep:
        return machines.value, machines
    label = machines.source if machines.source.startswith("--") else f"num_machines (from {machines.source})"
    bounds = [int(part) if part.strip().isdigit() else 0 for part in (low, high)]
    if min(bounds) < 1:
        problems.append(f"{label}: {machines.value!r} is not a number of machines; give N, or MIN:MAX (e.g. 1:2) "
                        "for an elastic job")
        return 1, Value(1, machines.source)
    if bounds[0] > bounds[1]:
        problems.append(f"{label}: {machines.value!r} has MIN {bounds[0]} above MAX {bounds[1]}; give MIN:MAX with "
                        "MIN <= MAX")
        return bounds[1], Value(bounds[1], machines.source)
    return bounds[0], Value(bounds[1], machines.source)


def dynamo_backend(args: argparse.Namespace, config: dict[str, Any], problems: list[str]) -> str:
    """The compile backend: the flag's, else the config file's ``dynamo_config``, else ``"no"``."""
    flag = flag_value(args, "dynamo_backend")
    if flag is not None:
        return str(check_value(by_name()["dynamo_backend"], "--dynamo_backend", flag, problems)).lower()
    backend = (config.get("dynamo_config") or {}).get("dynamo_backend")
    return str(backend).lower() if backend else "no"


def check_together(num_processes: Value, num_machines: Value, machine_rank: Value, ip: Value,
                    problems: list[str]) -> None:
    """The process count, the machine count, this machine's rank and the main address, together."""
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


def command_of(args: argparse.Namespace, problems: list[str]) -> Command:
    """What each worker runs, with what is wrong with it (a missing script or program, clashing flags)."""
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

