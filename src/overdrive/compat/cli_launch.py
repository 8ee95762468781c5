"""``accelerate.commands.launch`` and ``accelerate.utils.launch`` over ``overdrive launch``.

Libraries drive Accelerate's launcher from Python: TRL's command line parses with
``launch_command_parser()`` and runs ``launch_command(args)``. Here the parser is ``overdrive launch``'s
(every Accelerate flag), and the namespace it returns reads as Accelerate's does: switches ``False`` and
numbers typed when given, and ``nondefault`` naming the flags given. ``launch_command`` hands the flags
given (and any value a caller changed) to ``overdrive launch``: the config file still fills the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from contextlib import suppress
from typing import Any

import torch
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from overdrive.cli import UsageError
from overdrive.cli.launch import add_launch_flags, plan_launch, read_config, run
from overdrive.compat.alias import is_installed_as_accelerate
from overdrive.compat.environment_checks import get_free_port
from overdrive.helpers.environment import patch_environment
from overdrive.launchers.accelerate_variables import variables_for_workers
from overdrive.launchers.config_file import ConfigError
from overdrive.launchers.failure_report import CHILD_STDERR_CHUNK_SIZE, CHILD_STDERR_TAIL_CHUNKS
from overdrive.launchers.torchrun import last_failure_stderr, worker_environ

try:  # Accelerate's launcher ends a child's whole tree through psutil (a dependency of Accelerate, not ours)
    import psutil
except ImportError:  # pragma: no cover - psutil comes with Accelerate and with most environments
    psutil = None

#: Accelerate's types for the flags whose values are not text (the rest stay strings, as in Accelerate)
_INT = ("num_processes", "num_machines", "machine_rank", "main_process_port", "num_cpu_threads_per_process",
        "max_restarts", "gradient_accumulation_steps", "fp8_margin", "fp8_interval", "fp8_amax_history_len",
        "parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size", "parallelism_config_tp_size",
        "parallelism_config_cp_size", "parallelism_config_sp_size", "megatron_lm_tp_degree", "megatron_lm_pp_degree",
        "megatron_lm_num_micro_batches", "fsdp_min_num_params", "zero_stage")
_FLOAT = ("monitor_interval", "gradient_clipping", "megatron_lm_gradient_clipping", "timeout")
#: Accelerate's defaults where they are not None (switches) / False; a value equal to its default counts as
#: not given when the namespace goes back to overdrive launch
_DEFAULTS: dict[str, Any] = {
    "monitor_interval": 0.1, "max_restarts": 0, "rdzv_backend": "static", "rdzv_conf": "", "tee": "0",
    "dynamo_mode": "default", "dynamo_use_dynamic": None, "role": "default", "debug": None, "module": None, "no_python": None, "quiet": None,
    "fsdp_activation_checkpointing": "false", "fsdp_activation_checkpointing_offload": "false",
    "fsdp_cpu_ram_efficient_loading": "true", "fsdp_forward_prefetch": "false", "fsdp_min_num_params": 100000000,
    "fsdp_offload_params": "false", "fsdp_reshard_after_forward": "true", "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_sync_module_states": "true", "fsdp_use_orig_params": "true", "fsdp_version": "1",
    "fp8_amax_compute_algo": "most_recent", "fp8_amax_history_len": 1024, "fp8_enable_fsdp_float8_all_gather": 1,
    "fp8_format": "HYBRID", "fp8_interval": 1, "fp8_margin": 0,
    "fp8_override_linear_precision": (False, False, False), "fp8_pad_inner_dim": 1,
    **{f"megatron_lm_{name}": False for name in ("eod_mask_loss", "no_load_optim", "no_save_optim",
                                                 "optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d",
                                                 "use_custom_fsdp", "use_precision_aware_optimizer")},
    "megatron_lm_gradient_clipping": 1.0, "megatron_lm_pp_degree": 1, "megatron_lm_tp_degree": 1,
    **{f"parallelism_config_{name}_size": 1 for name in ("cp", "dp_replicate", "dp_shard", "sp", "tp")},
    "parallelism_config_cp_backend": "torch", "parallelism_config_cp_comm_strategy": "allgather",
    "parallelism_config_sp_attn_implementation": "sdpa", "parallelism_config_sp_backend": "deepspeed",
    "parallelism_config_sp_seq_length_is_variable": True,
}
_KEEP = ("training_script", "training_script_args", "module", "no_python", "as_accelerate", "run", "command")


class _UnderscoreHelp(argparse.HelpFormatter):
    """Help that lists each flag once, by its underscore spelling (Accelerate's help)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [o for o in action.option_strings if "-" not in o.lstrip("-")] or action.option_strings
        saved = action.option_strings
        action.option_strings = shown
        try:
            return super()._format_action_invocation(action)
        finally:
            action.option_strings = saved


class AccelerateLaunchParser(argparse.ArgumentParser):
    """``overdrive launch``'s parser returning Accelerate-shaped namespaces (see the module docstring)."""

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        """argparse's, then Accelerate's defaults and types filled in and ``nondefault`` recorded."""
        parsed, extra = super().parse_known_args(*args, **kwargs)
        given = {action.dest for action in self._actions if action.option_strings
                 and getattr(parsed, action.dest, None) not in (None, action.default)}
        for action in self._actions:
            dest = action.dest
            if dest == "help" or not hasattr(parsed, dest):
                continue
            value = getattr(parsed, dest)
            if dest in _DEFAULTS and value == action.default:
                value = _DEFAULTS[dest]
            elif value is None and isinstance(action, argparse._StoreTrueAction):
                value = False
            elif dest in _INT and isinstance(value, str):
                value = int(value)
            elif dest in _FLOAT and isinstance(value, str):
                value = float(value)
            setattr(parsed, dest, value)
        parsed.nondefault = given | {"training_script", "training_script_args"} | set(getattr(parsed, "nondefault", ()))
        return parsed, extra


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``launch_command_parser``: the ``overdrive launch`` flags (all of ``accelerate launch``'s),
    the script and its arguments. With ``subparsers``, registered there as ``launch``."""
    description = ("Launch a python script in a distributed scenario (overdrive launch). Arguments can be passed "
                   "in with either hyphens (`--num-processes=2`) or underscores (`--num_processes=2`)")
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, formatter_class=_UnderscoreHelp)
        parser.__class__ = AccelerateLaunchParser
    else:
        parser = AccelerateLaunchParser(prog="accelerate launch", description=description, allow_abbrev=False,
                                        formatter_class=_UnderscoreHelp)
    add_launch_flags(parser)
    parser.add_argument("training_script", help="the script (or module with -m, program with --no_python)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def overdrive_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """``overdrive launch``'s namespace for Accelerate's ``args``: the flags given, or changed from their default,
    keep their value; the others are left to the config file and overdrive's defaults."""
    parser = launch_command_parser()
    defaults = vars(parser.parse_args(["x.py"]))
    given = set(getattr(args, "nondefault", set()))
    out = argparse.Namespace()
    for dest, default in defaults.items():
        if dest in ("nondefault",):
            continue
        value = getattr(args, dest, default)
        # a namespace built by hand spells "not given" as Accelerate's defaults: False, 0, "false", ...
        changed = value != default and not (value is False or value in (0, "", "false", "no"))
        keep = dest in _KEEP or dest in given or changed
        setattr(out, dest, value if keep else None)
    out.module, out.no_python = bool(out.module), bool(out.no_python)

    # called through the alias (TRL's command line): the script gets 'accelerate' as this process does
    out.as_accelerate = bool(getattr(out, "as_accelerate", False)) or is_installed_as_accelerate()
    out.role = out.role or "default"
    return out


def launch_command(args: argparse.Namespace) -> None:
    """Accelerate's ``launch_command``: run the script as ``overdrive launch`` would with these flags. A bad flag
    or config file raises ``ValueError`` (listing every problem); a failed run ``subprocess.CalledProcessError``
    whose ``stderr`` is the end of the failed processes' stderr (also its ``__cause__``, as in Accelerate);
    with ``--quiet``, ``SystemExit(1)`` instead."""
    try:
        code = run(overdrive_namespace(args))
    except (UsageError, ConfigError) as err:
        raise ValueError(str(err)) from None
    if code:
        if getattr(args, "quiet", False):
            sys.exit(1)
        stderr = last_failure_stderr()
        raise subprocess.CalledProcessError(code, ["overdrive", "launch", str(args.training_script)],
                                            stderr=stderr) from RuntimeError(stderr)


def _served() -> Any:
    """``accelerate.commands.launch`` as served, where tests patch names (``psutil``, ``prepare_multi_gpu_env``)."""
    return importlib.import_module("overdrive.commands.launch")


def simple_launcher(args: argparse.Namespace) -> None:
    """Accelerate's ``simple_launcher``: the script in one child process (``prepare_simple_launcher_cmd_env``),
    its stderr written through as it comes and its end kept: a failure raises ``CalledProcessError`` with
    that ``stderr`` (``SystemExit(1)`` with ``--quiet``); SIGTERM or Ctrl-C end the child's whole tree and
    exit with 128 + the signal."""
    command, env = _served().prepare_simple_launcher_cmd_env(args)
    _run_child(command, env, bool(getattr(args, "quiet", False)))


def _run_child(command: list[str], env: dict[str, str], quiet: bool) -> None:
    tools = _served().psutil
    popen = tools.Popen if tools is not None else subprocess.Popen
    process = popen(command, env=env, stderr=subprocess.PIPE)
    tail: deque[bytes] = deque(maxlen=CHILD_STDERR_TAIL_CHUNKS)

    def copy_stderr() -> None:
        while chunk := process.stderr.read1(CHILD_STDERR_CHUNK_SIZE):
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
            tail.append(chunk)

    def on_sigterm(signum: int, frame: Any) -> None:
        sys.exit(128 + signum)

    previous = None
    reader = None
    try:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        copy_stderr()
        process.wait()
    except (KeyboardInterrupt, SystemExit) as stop:
        reader = threading.Thread(target=copy_stderr, daemon=True)  # the child's last words, while it stops
        reader.start()
        _end_tree(process, tools)
        reader.join(timeout=5)
        if isinstance(stop, KeyboardInterrupt):
            sys.exit(128 + signal.SIGINT)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if reader is None or not reader.is_alive():
            process.stderr.close()
    if process.returncode != 0:
        if quiet:
            sys.exit(1)
        text = b"".join(tail).decode(errors="replace")
        raise subprocess.CalledProcessError(process.returncode, command, stderr=text) from RuntimeError(text)


def _end_tree(process: Any, tools: Any) -> None:
    """SIGTERM to the child and everything under it (also what left for a session of its own), SIGKILL to
    what is left after 5 s."""
    if tools is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return
    members = [process]
    with suppress(tools.NoSuchProcess):
        members += process.children(recursive=True)
    alive = members
    try:
        for member in members:
            with suppress(tools.NoSuchProcess):
                member.terminate()
        _, alive = tools.wait_procs(members, timeout=5)
    finally:
        for member in alive:
            with suppress(tools.NoSuchProcess):
                member.kill()
        tools.wait_procs(alive, timeout=5)
        process.wait()


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Accelerate's ``multi_gpu_launcher``: torchrun, in this process, over ``prepare_multi_gpu_env``'s
    environment. Ctrl-C exits 130 and a signal 128 + its number (torchrun has stopped the workers); with
    ``--quiet`` a failed worker's error is printed without the launcher's traceback and exits 1."""


    env = _served().prepare_multi_gpu_env(args)
    quiet = bool(getattr(args, "quiet", False))
    script = [args.training_script, *getattr(args, "training_script_args", [])]
    torchrun_args = torchrun.get_args_parser().parse_args(script)
    for name, value in vars(args).items():  # the fields prepare_multi_gpu_env filled (nproc_per_node, ...)
        if name in vars(torchrun_args) and name not in ("training_script", "training_script_args"):
            setattr(torchrun_args, name, value)
    try:
        with patch_environment(**env):
            torchrun.run(torchrun_args)
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    except SignalException as err:
        sys.exit(128 + int(err.sigval))
    except ChildFailedError as err:
        if not quiet:
            raise
        print(err, file=sys.stderr)
        sys.exit(1)


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Accelerate's ``_validate_launch_command``: ``args`` completed from the config file (flags given win),
    the config read (or None) and whether the mixed precision came from it."""
    config, _ = read_config(overdrive_namespace(args))
    given = set(getattr(args, "nondefault", set()))
    for key, value in config.items():
        if isinstance(value, dict):
            prefix = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}.get(key, "")
            for inner, item in value.items():
                name = inner if inner.startswith(prefix) else prefix + inner
                if name not in given:
                    setattr(args, name, item)
        elif key not in ("compute_environment", "distributed_type", "mixed_precision") and key not in given \
                and getattr(args, key, None) in (None, False):
            setattr(args, key, value)
    from_config = not getattr(args, "mixed_precision", None) and config.get("mixed_precision") is not None
    args.mixed_precision = args.mixed_precision or config.get("mixed_precision") or "no"
    args.dynamo_backend = getattr(args, "dynamo_backend", None) or "no"
    args.num_machines = args.num_machines or 1
    args.use_cpu = bool(getattr(args, "cpu", False) or config.get("use_cpu"))
    if not config:  # as Accelerate without a config file: one process per device, one on the CPU (--cpu)
        devices = 0 if args.cpu else _device_count()
        if args.num_processes is None:
            args.num_processes = max(devices, 1)
        if args.debug is None:
            args.debug = False
        if not args.multi_gpu and args.num_processes > 1 and devices > 1:
            args.multi_gpu = True
    return args, (argparse.Namespace(**config) if config else None), from_config


def _device_count() -> int:
    return torch.accelerator.device_count() if torch.accelerator.is_available() else 0


def _plan_environ(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    given = overdrive_namespace(args)
    script = given.training_script
    missing = not given.module and not given.no_python and script and not os.path.isfile(str(script))
    if missing:  # Accelerate builds the command without looking for the script: the child reports it
        given.training_script = __file__
    plan, command, _ = plan_launch(given)
    if missing:
        command = dataclasses.replace(command, target=str(script))
    env = dict(os.environ)
    env.update({k: v for k, v in worker_environ(plan).items() if v is not None})
    env["ACCELERATE_USE_CPU"] = str(bool(getattr(args, "cpu", False) or getattr(args, "use_cpu", False)))
    if env["ACCELERATE_USE_CPU"] == "True":  # Intel OpenMP placement, as Accelerate's launcher sets it
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    target = [command.target] if command.no_python else [sys.executable, *(["-m"] if command.module else []),
                                                         command.target]
    return [*target, *command.args], env


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Accelerate's ``prepare_simple_launcher_cmd_env``: the command one process runs and its environment
    (this process's, plus the variables ``overdrive launch`` exports for ``args``). With ``mpirun_hostfile``
    (``mpirun_config`` in the config file) the command starts with Accelerate's ``mpirun`` line."""
    mpirun = _mpirun_args(args)
    if not mpirun:
        return _plan_environ(args)
    plain = argparse.Namespace(**vars(args))
    plain.mpirun_hostfile = None  # overdrive launch refuses it: the mpirun line is built here instead
    command, env = _plan_environ(plain)
    return [*mpirun, *command], env


def _mpirun_args(args: argparse.Namespace) -> list[str]:
    """Accelerate's ``mpirun`` prefix for ``args.mpirun_hostfile`` (none without one). The MPI program is
    found through ``accelerate.utils.launch.which`` and its ``subprocess``, looked up when called, so that
    tests can patch them there as they do with Accelerate."""
    hostfile = getattr(args, "mpirun_hostfile", None)
    if hostfile is None:
        return []

    launch = importlib.import_module("overdrive.utils.launch")
    found = [name for name in ("mpirun", "mpiexec") if launch.which(name)]
    if not found:
        raise OSError("mpirun or mpiexec were not found: install Intel MPI, Open MPI or MVAPICH, or leave out "
                      "mpirun_hostfile to start the processes with torchrun")
    if b"Open MPI" in launch.subprocess.check_output([found[0], "--version"]):
        names = ("--hostfile", "-n", "--npernode", "--bind-to")
    else:  # Intel MPI and MVAPICH
        names = ("-f", "-n", "-ppn", "")
    processes, machines = getattr(args, "num_processes", None), getattr(args, "num_machines", None)
    per_machine = str(processes // machines) if processes and machines else "1"
    line = [found[0], names[0], str(hostfile), names[2], per_machine]
    if processes:
        line += [names[1], str(processes)]
    if names[3]:
        line += [names[3], "socket"]
    return line


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Accelerate's ``prepare_multi_gpu_env``: the workers' environment for ``args``; like Accelerate it fills
    torchrun's fields on ``args`` (``master_port`` a free port when ``main_process_port`` is 0)."""
    if getattr(args, "main_process_port", None) == 0:
        args.main_process_port = get_free_port()
    elif getattr(args, "main_process_port", None) is None:
        args.main_process_port = 29500
    num_machines = getattr(args, "num_machines", 1) or 1
    args.nproc_per_node = str((getattr(args, "num_processes", 1) or 1) // num_machines)
    args.nnodes = str(num_machines)
    args.node_rank = int(getattr(args, "machine_rank", 0) or 0)
    args.master_addr = str(getattr(args, "main_process_ip", None) or "127.0.0.1")
    args.master_port = str(args.main_process_port)
    args.training_script = getattr(args, "training_script", None) or sys.argv[0]
    return _plan_environ(args)[1] if os.path.isfile(str(args.training_script)) else _environ_only(args)


def _environ_only(args: argparse.Namespace) -> dict[str, str]:
    """The variables for ``args`` without a script to check (Accelerate builds them without one)."""
    env = dict(os.environ)
    env.update(variables_for_workers({"mixed_precision": getattr(args, "mixed_precision", "no"),
                                      "debug": bool(getattr(args, "debug", False))}))
    env.update(MASTER_ADDR=args.master_addr, MASTER_PORT=args.master_port)
    return env


def _script_value(text: str) -> Any:
    """A training-script argument's value as SageMaker hyperparameters carry it: bool, int, float or str."""
    if text in ("True", "False"):
        return text == "True"
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """A training script's ``--key value`` arguments as a dict of typed values (Accelerate's SageMaker helper).

    Every ``--key`` must be followed by a value: SageMaker passes hyperparameters as key/value pairs, so a bare
    flag (``store_true``) has no way through and is refused.
    """
    converted: dict[str, Any] = {}
    for index, token in enumerate(nargs):
        if not token.startswith("-"):
            continue
        value = nargs[index + 1] if index + 1 < len(nargs) else None
        if value is None or value.startswith("-"):
            raise ValueError(f"training script argument {token!r} has no value: SageMaker passes hyperparameters "
                             "as '--key value' pairs and cannot carry store_true/store_false flags; give it an "
                             f"explicit value (e.g. '{token} True')")
        converted[token.lstrip("-").replace("-", "_")] = _script_value(value)
    return converted
