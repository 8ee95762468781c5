"""The ``overdrive`` command: ``launch``, ``config``, ``env`` and ``test``, with Accelerate's flags.

    overdrive config default            # write a config file for this machine, no questions
    overdrive launch --num_processes 2 train.py --lr 1e-3
    overdrive env                       # what to paste into a bug report
    overdrive test                      # can this machine train?
    overdrive plot RUN_DIR              # a run's metrics as a PNG and a table
    overdrive estimate-memory ./model   # memory to load / train a model, from its config
    overdrive doctor                    # ports, names, rendezvous, interfaces, disk: what to fix first
    overdrive merge-weights CKPT OUT    # a save_state checkpoint's model as full safetensors
    overdrive to-fsdp2 --config_file C --output_file O   # an Accelerate FSDP1 config file as FSDP2
    overdrive --version                 # overdrive's version, the Accelerate API it follows, torch's

Usage errors (a bad flag, value or config file) print what was wrong, where it came from and the valid
choices, and exit with status 2.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from overdrive._version import ACCELERATE_API_VERSION, __version__

USAGE_ERROR = 2

# subcommand -> module with add_parser(subparsers) and run(args) -> int
_COMMANDS = {
    "launch": "overdrive.cli.launch",
    "config": "overdrive.cli.config_cmd",
    "env": "overdrive.cli.env_cmd",
    "test": "overdrive.cli.test_cmd",
    "estimate-memory": "overdrive.cli.estimate_cmd",
    "doctor": "overdrive.cli.doctor",
    "to-fsdp2": "overdrive.cli.to_fsdp2_cmd",
    "tpu-config": "overdrive.cli.tpu_cmd",
    "lighthouse": "overdrive.cli.lighthouse",
}


# subcommands that parse their own arguments: name -> (module, function taking the arguments after the name)
_SELF_PARSING = {"plot": ("overdrive.cli.plot", "plot_main"),
                 "merge-weights": ("overdrive.checkpoint.export", "merge_weights_main")}


class UsageError(Exception):
    """A problem with what the user typed or configured; printed without a traceback, exit status 2."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def plain(text: str) -> str:
    """``text`` without reStructuredText's double backticks (help texts come from docstrings)."""
    return re.sub(r"``([^`]*)``", r"'\1'", text)


class Parser(argparse.ArgumentParser):
    """argparse with exit status 2 messages that lead with the problem and suggest the nearest flag for a
    mistyped one, and help texts without reStructuredText markup."""

    def format_help(self) -> str:
        """The help text, as plain text."""
        return plain(super().format_help())

    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments:" in message:
            known = _flags(self)
            words = message.split("unrecognized arguments:", 1)[1].split()
            hints = []
            for word in words:
                flag = word.split("=", 1)[0]
                if not flag.startswith("-"):
                    continue  # the value of a mistyped flag, or a stray word
                match = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                hints.append(f"{flag!r} is not a flag of '{self.prog}'" + (f" (did you mean {match[0]}?)" if match else ""))
            if not hints:
                hints = [f"unexpected arguments {' '.join(words)!r}"]
            message = "; ".join(hints) + f". See '{self.prog} --help' for the flags."
        # the problem first; a long usage (launch's is 40 lines) would push it off the screen
        usage = self.format_usage()
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        if usage.count("\n") <= 3:
            sys.stderr.write(usage)
        elif "--help" not in message:
            sys.stderr.write(f"usage: '{self.prog} --help' lists every flag\n")
        self.exit(USAGE_ERROR)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag of ``parser`` and of its subcommands."""
    flags = []
    for action in parser._actions:
        flags += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags += _flags(sub)
    return flags


def add_flag(group: argparse._ActionsContainer, name: str, *aliases: str, **kwargs: Any) -> None:
    """A flag under Accelerate's name, also spelled with dashes: ``--num_processes`` and ``--num-processes``."""
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    group.add_argument(*spellings, *aliases, dest=name, **kwargs)


def add_setting_flag(group: argparse._ActionsContainer, setting: Any) -> None:
    """The flag of a launch setting (``overdrive.launchers.settings.Setting``), built from the schema:
    a switch, a repeatable flag, a boolean that may stand alone (``--fsdp_offload_params`` = true) or a
    value; every default is None so that a flag given can be told apart from one left out."""
    name, text = setting.flag_name, setting.help
    if setting.default not in (None, False, "") and "default" not in text:
        text += f" (default: {setting.default})"
    kwargs: dict[str, Any] = {"default": None, "help": argparse.SUPPRESS if setting.hidden else (text or None)}
    if setting.switch:
        kwargs["action"] = "store_true"
    elif setting.append:
        kwargs.update(action="append", metavar=setting.kind.shown_metavar())
    elif setting.kind.metavar == "BOOL":
        kwargs.update(nargs="?", const="true", metavar="VALUE")
    else:
        kwargs["metavar"] = setting.kind.shown_metavar()
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    group.add_argument(*spellings, *setting.aliases, dest=setting.name, **kwargs)


def build_parser(only: str | None = None) -> tuple[Parser, dict[str, Parser]]:
    """The ``overdrive`` parser and each subcommand's own parser (with ``only``: that subcommand's alone, so
    that ``overdrive launch`` does not import and build the other seven on every start)."""
    parser = Parser(prog="overdrive", description="Launch and configure overdrive training runs.",
                    allow_abbrev=False)
    parser.add_argument("-V", "--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join([*_COMMANDS, *_SELF_PARSING]) + "}", parser_class=Parser)
    for name, module in _COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
    sub.add_parser("plot", help="plot a run's metrics.jsonl (overdrive plot --help)", add_help=False)
    sub.add_parser("merge-weights", help="a save_state checkpoint's model as full safetensors (--help)",
                   add_help=False)
    return parser, dict(sub.choices)


def version_line() -> str:
    """``overdrive --version``: overdrive's version, the Accelerate API it follows and the torch it runs on."""
    return f"overdrive {__version__} (Accelerate API {ACCELERATE_API_VERSION}, torch {torch_version()})"


def torch_version() -> str:
    """``torch.__version__`` with its build tag, whatever it is (``2.13.0+cpu``, ``2.15.0+cu132``, ``2.15.0``),
    read from ``torch/version.py`` without importing torch (seconds). The installed metadata is only the
    fallback: a build from the package index records ``2.15.0`` there while torch says ``2.15.0+cu132``."""
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(folder) / "version.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                return node.value.value
    from importlib import metadata  # lazy: it loads email and zipfile; only the fallback reads it

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``overdrive <command> ...``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _SELF_PARSING:
        module, function = _SELF_PARSING[argv[0]]
        return int(getattr(importlib.import_module(module), function)(argv[1:]) or 0)
    if argv and argv[0] in ("--version", "-V"):
        print(version_line())
        return 0
    parser, commands = build_parser(argv[0] if argv and argv[0] in _COMMANDS else None)
    if not argv or argv[0] not in _COMMANDS:
        if argv and argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        names = [*_COMMANDS, *_SELF_PARSING]
        match = difflib.get_close_matches(argv[0], names, n=1) if argv else []
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        what = f"unknown command {argv[0]!r}{hint}" if argv else "no command given"
        print(f"overdrive: error: {what}; choose from {', '.join(names)} (overdrive --help)", file=sys.stderr)
        return USAGE_ERROR
    # The subcommand's own parser reads the rest, so its errors name it and its flags.
    args = commands[argv[0]].parse_args(argv[1:])
    if not hasattr(args, "command"):  # tpu-config has a --command flag of its own (Accelerate's)
        args.command = argv[0]
    from overdrive.launchers.config_file import ConfigError  # lazy: the settings schema, not for --version

    try:
        return int(args.run(args) or 0)
    except (UsageError, ConfigError) as err:
        prog = f"overdrive {argv[0]}"
        if isinstance(err, ConfigError):
            err = UsageError(str(err))
        if len(err.problems) == 1:
            print(f"{prog}: error: {err.problems[0]}", file=sys.stderr)
        else:
            print(f"{prog}: error: {len(err.problems)} problems:\n  - " + "\n  - ".join(err.problems),
                  file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"\noverdrive {argv[0]}: interrupted", file=sys.stderr)
        return 130
