"""``overdrive config``: write the launch config file (Accelerate's keys) by questions or defaults.

    overdrive config                    # questions in the terminal (Enter keeps the [default])
    overdrive config default            # no questions: this machine, all its devices
    overdrive config update             # rewrite an existing file with today's keys
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overdrive.cli import UsageError, add_flag, add_setting_flag
from overdrive.config.choices import invalid_choice
from overdrive.launchers import config_file as cf
from overdrive.launchers.setting_kinds import Bool
from overdrive.launchers.settings import MIXED_PRECISION, Setting, by_name

SETTINGS = by_name()


def add_parser(sub: Any) -> None:
    """Register ``overdrive config`` (the questions) and its actions ``default`` and ``update`` on ``sub``."""
    parser = sub.add_parser("config", help="write the config file 'overdrive launch' reads",
                            description="Answer a few questions and write the config file that 'overdrive launch' "
                                        f"reads (default: {cf.default_config_path()}).", allow_abbrev=False)
    add_flag(parser, "config_file", metavar="PATH", help="where to write (default: the default config file)")
    parser.set_defaults(run=run_questions)
    actions = parser.add_subparsers(dest="action", metavar="{default,update}")
    default = actions.add_parser("default", help="write a config for this machine without asking anything",
                                 allow_abbrev=False)
    add_flag(default, "config_file", metavar="PATH", help="where to write (default: the default config file)")
    for name in ("mixed_precision", "num_processes", "cpu"):
        add_setting_flag(default, SETTINGS[name])
    add_flag(default, "force", action="store_true", help="overwrite an existing file")
    default.set_defaults(run=run_default)
    update = actions.add_parser("update", help="rewrite an existing config file with the current keys",
                                allow_abbrev=False)
    add_flag(update, "config_file", metavar="PATH", help="the file to update (default: the default config file)")
    update.set_defaults(run=run_update)


def _device() -> tuple[str, int]:
    import torch  # lazy: `overdrive --help` builds this parser; torch loads only when a file is written

    if not torch.accelerator.is_available():
        return "cpu", 0
    accelerator = torch.accelerator.current_accelerator()
    return (accelerator.type if accelerator else "cpu"), torch.accelerator.device_count()


def _target(args: argparse.Namespace) -> Path:
    return Path(args.config_file).expanduser() if getattr(args, "config_file", None) else cf.default_config_path()


def how_launch_reads(path: Path) -> str:
    """How ``overdrive launch`` reads the file at ``path``: by itself when it is the file launch finds without
    ``--config_file`` (the same lookup launch makes), else with ``--config_file``."""
    found = cf.find_config(None).path
    if found is not None and found.resolve() == path.resolve():
        return "'overdrive launch script.py' will use it"
    return f"use it with 'overdrive launch --config_file {path} script.py'"


def run_default(args: argparse.Namespace) -> int:
    """``overdrive config default``: write a config for this machine without questions (an existing file is
    kept unless ``--force``); returns the exit status."""
    path = _target(args)
    if path.exists() and not args.force:
        print(f"overdrive config: {path} exists already and was left as it is; pass --force to overwrite it "
              "or --config_file to write elsewhere", file=sys.stderr)
        return 0
    problems: list[str] = []
    precision, problem = SETTINGS["mixed_precision"].check("--mixed_precision", args.mixed_precision or "no")
    problems += [problem] if problem else []
    num_processes = None
    if args.num_processes is not None:
        num_processes, problem = SETTINGS["num_processes"].check("--num_processes", args.num_processes)
        problems += [problem] if problem else []
    if problems:
        raise UsageError(problems)
    device_type, count = _device()
    config = cf.basic_config(precision, num_processes=num_processes, cpu=True if args.cpu else None,
                             device_count=count, device_type=device_type)
    cf.save_config(config, path)
    print(f"overdrive config: saved at {path}; {how_launch_reads(path)}")
    return 0


def run_update(args: argparse.Namespace) -> int:
    """``overdrive config update``: rewrite an existing config file with the current keys (Accelerate's
    ``accelerate config update``); returns the exit status."""
    path = _target(args)
    if not path.is_file():
        raise UsageError(f"there is no config file at {path} to update; run 'overdrive config' to write one")
    try:
        config = cf.load_config(path)
    except cf.ConfigError as err:
        raise UsageError(str(err)) from None
    cf.save_config(cf.updated_config(config), path)
    print(f"overdrive config: updated {path}")
    return 0


# -- the questionnaire -----------------------------------------------------------------------------------
class Asker:
    """Ask on the terminal (or read answers from a pipe); Enter keeps the default; a bad answer is asked again;
    the end of the input (Ctrl-D, a pipe that ran out) stops the questions with nothing written."""

    def __init__(self, tries: int = 3) -> None:
        self.tries = tries

    def ask(self, question: str, default: Any, parse: Callable[[str], tuple[Any, str | None]]) -> Any:
        """Ask ``question`` until ``parse`` accepts the answer and return the parsed value.

        ``parse`` returns ``(value, problem)``; a problem is printed and the question asked again. An
        empty answer gives ``default``. Raises ``UsageError`` after ``tries`` rejected answers, or at the end
        of the input (nothing is written then: defaults the user never saw are not a configuration)."""
        for _ in range(self.tries):
            try:
                answer = input(f"{question} [{_show(default)}]: ").strip()
            except EOFError:
                print()
                raise UsageError(f"the input ended before an answer to {question!r}: nothing was written "
                                 "(answer every question, or run 'overdrive config default' for this "
                                 "machine's defaults)") from None
            if not answer:
                return default
            value, problem = parse(answer)
            if problem is None:
                return value
            print(f"  {problem}")
        raise UsageError(f"no valid answer to {question!r} after {self.tries} tries")

    def setting(self, setting: Setting, default: Any, question: str | None = None) -> Any:
        """Ask the setting's question (or ``question``); the answer is checked by the setting's kind, and a
        bad one gets the same message as the flag or the config file would (labelled with the key)."""
        def parse(answer: str) -> tuple[Any, str | None]:
            if setting.kind.metavar == "BOOL":
                answer = {"y": "yes", "n": "no"}.get(answer.lower(), answer)
            return setting.check(setting.yaml_key or setting.name, answer)
        return self.ask(question or setting.question or setting.name, default, parse)

    def choose(self, question: str, choices: list[str], default: str) -> str:
        """Print the numbered ``choices``; return the one picked by number or name (``default`` on Enter)."""
        def parse(answer: str) -> tuple[Any, str | None]:
            if answer.isdigit() and 0 <= int(answer) < len(choices):
                return choices[int(answer)], None
            if answer in choices:
                return answer, None
            return answer, invalid_choice(repr(answer), answer, choices)
        print(question)
        for index, choice in enumerate(choices):
            print(f"  {index}) {choice}")
        return str(self.ask("  number or name", default, parse))


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)


def _yes_no(answer: str) -> tuple[Any, str | None]:
    answer = {"y": "yes", "n": "no"}.get(answer.lower(), answer)
    value, problem = Bool().check("answer", answer)
    return (value, None) if problem is None else (answer, f"{answer!r}: answer yes or no")


def questionnaire(asker: Asker, device_type: str, device_count: int) -> dict[str, Any]:
    """The answers as a config mapping (Accelerate's keys)."""
    gpu_kind = ("multi-GPU" if device_type == "cuda" else f"multi-{device_type.upper()}") if device_count else None
    kinds = ["no distributed training", "multi-CPU"] + ([gpu_kind] if gpu_kind else [])
    kind = asker.choose("Which kind of training?", kinds, kinds[2] if device_count > 1 else kinds[0])
    config = cf.basic_config(device_count=device_count, device_type=device_type, cpu=kind != gpu_kind)
    config.pop("gpu_ids", None)
    if kind == "no distributed training":
        config.update(distributed_type="NO", num_processes=1)
        config["use_cpu"] = device_count == 0 or bool(asker.setting(SETTINGS["cpu"], False))
    else:
        config["distributed_type"] = "MULTI_CPU" if kind == "multi-CPU" else (
            "MULTI_GPU" if device_type == "cuda" else f"MULTI_{device_type.upper()}")
        machines = asker.setting(SETTINGS["num_machines"], 1)
        config["num_machines"] = machines
        if machines > 1:
            for name, default in (("machine_rank", 0), ("main_process_ip", None), ("main_process_port", 29500),
                                  ("same_network", True)):
                config[name] = asker.setting(SETTINGS[name], default)
            rdzv = SETTINGS["rdzv_backend"]
            config["rdzv_backend"] = asker.choose(str(rdzv.question), ["static", "c10d"], "static")
        per_machine = device_count if kind == gpu_kind else 2
        processes = SETTINGS["num_processes"]
        config["num_processes"] = asker.setting(processes, per_machine * machines,
                                                f"{str(processes.question)[:-1]} (over {machines} machine(s))?")
        if kind == gpu_kind:
            config["gpu_ids"] = asker.setting(SETTINGS["gpu_ids"], "all")
    if asker.ask("Compile the model with torch.compile (dynamo)?", False, _yes_no):
        backend = asker.choose(str(SETTINGS["dynamo_backend"].question), ["inductor", "eager", "aot_eager", "cudagraphs"],
                               "inductor")
        config["dynamo_config"] = {"dynamo_backend": backend.upper()}
    config["mixed_precision"] = asker.choose(str(SETTINGS["mixed_precision"].question), list(MIXED_PRECISION), "no")
    return config


def run_questions(args: argparse.Namespace) -> int:
    """``overdrive config``: ask the questions on the terminal and save the answers; returns 0."""
    path = _target(args)
    device_type, count = _device()
    print(f"overdrive config: a few questions for {path} (Enter keeps the [default])")
    config = questionnaire(Asker(), device_type, count)
    cf.save_config(config, path)
    print(f"overdrive config: saved at {path}; {how_launch_reads(path)}")
    return 0
