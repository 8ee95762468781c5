"""The rest of Accelerate's command modules (``accelerate.commands.{accelerate_cli, config.*, merge, utils}``
and the helpers of ``launch`` / ``estimate`` / ``to_fsdp2``) over overdrive's commands: each entry point runs
the ``overdrive`` command of the same name, each parser has its flags."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overdrive.cli import main as cli_main
from overdrive.cli.config_cmd import Asker, _device, questionnaire, run_questions, run_update
from overdrive.cli.to_fsdp2_cmd import DROPPED, RESHARD
from overdrive.compat.cli_commands import _sub_parser
from overdrive.compat.cli_launch import launch_command
from overdrive.compat.config_commands import _default_config_file, write_basic_config
from overdrive.compat.enums import ConversionStatus
from overdrive.compat.fsdp import merge_fsdp_weights
from overdrive.config.compile import DynamoBackend
from overdrive.helpers.imports import is_timm_available, is_transformers_available

# -- the entry points: `python -m accelerate.commands.<name>` and the `accelerate` console script ------------------


def _run_overdrive(*argv: str) -> None:
    code = cli_main([*argv, *sys.argv[1:]])
    if code:
        raise SystemExit(code)


def main() -> None:
    """The ``accelerate`` command line: ``overdrive`` with the same arguments."""
    _run_overdrive()


def _command_main(name: str) -> Callable[[], None]:
    def command_main() -> None:
        _run_overdrive(name)

    command_main.__name__ = command_main.__qualname__ = "main"
    command_main.__doc__ = f"``overdrive {name}`` with this process's arguments."
    return command_main


env_main, test_main, estimate_main = _command_main("env"), _command_main("test"), _command_main("estimate-memory")
launch_main, tpu_main, config_main = _command_main("launch"), _command_main("tpu-config"), _command_main("config")
merge_main = _command_main("merge-weights")

# -- accelerate.commands.config ---------------------------------------------------------------------------------------
config_description = "Launches a series of prompts to create and save a `default_config.yaml` configuration file"
default_description = "Create a default config file for Accelerate with only a few flags set."
update_description = ("Update an existing config file with the latest defaults while maintaining the old "
                      "configuration.")
#: the torch.compile back ends the config questions offer (Accelerate's list, without "NO")
DYNAMO_BACKENDS = [member.value for member in DynamoBackend if member.value != "NO"]
hf_cache_home = os.path.expanduser(os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"),
                                                                          "huggingface")))
cache_dir = os.path.join(hf_cache_home, "accelerate")
default_json_config_file = os.path.join(cache_dir, "default_config.json")
default_yaml_config_file = os.path.join(cache_dir, "default_config.yaml")


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help of a subcommand, without the parent's ``<command> [<args>]`` in its usage line."""

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """``overdrive config``'s parser (the questions, with ``default`` and ``update`` below it)."""
    return _sub_parser("overdrive.cli.config_cmd", "config", subparsers)


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``accelerate config`` parser: ``overdrive config``'s, with its subcommands."""
    return config_command_parser(subparsers)


def _action_parser(name: str, parser: Any, parents: Any = None) -> argparse.ArgumentParser:
    """``overdrive config <name>``'s parser, registered on ``parser`` (a subparsers object)."""
    own = config_command_parser()
    action = next(a for a in own._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    added = parser.add_parser(name, parents=[*(parents or []), action], add_help=False,
                              help=default_description if name == "default" else update_description,
                              formatter_class=SubcommandHelpFormatter)
    added.set_defaults(func=default_config_command if name == "default" else update_config_command)
    return added


def default_command_parser(parser: Any, parents: Any = None) -> argparse.ArgumentParser:
    """Register ``default`` (``overdrive config default``'s flags) on ``parser``."""
    return _action_parser("default", parser, parents)


def update_command_parser(parser: Any, parents: Any = None) -> argparse.ArgumentParser:
    """Register ``update`` (``overdrive config update``'s flags) on ``parser``."""
    return _action_parser("update", parser, parents)


def default_config_command(args: argparse.Namespace) -> None:
    """Write a config file for this machine (``overdrive config default``); print where."""
    path = write_basic_config(getattr(args, "mixed_precision", "no") or "no", getattr(args, "config_file", None))
    if path:
        print(f"accelerate configuration saved at {path}")


def update_config(args: argparse.Namespace) -> str:
    """Rewrite an existing config file with the current keys; returns its path. A missing file is
    ``ValueError`` naming it."""
    config_file = getattr(args, "config_file", None) or _default_config_file()
    if not Path(config_file).exists():
        raise ValueError(f"The passed config file located at {config_file} doesn't exist.")
    run_update(argparse.Namespace(config_file=config_file))
    return str(config_file)


def update_config_command(args: argparse.Namespace) -> None:
    """``update_config`` and say so."""
    print(f"Successfully updated the configuration file at {update_config(args)}.")


def config_command(args: argparse.Namespace) -> None:
    """Ask the questions and write the config file (``overdrive config``)."""
    run_questions(argparse.Namespace(config_file=getattr(args, "config_file", None)))


def get_user_input() -> dict[str, Any]:
    """Ask the config questions on this terminal; the answers as config-file keys."""
    return questionnaire(Asker(), *_device())


get_cluster_input = get_user_input

# -- accelerate.commands.merge -----------------------------------------------------------------------------------------
merge_description = ("Utility to merge the weights from multiple FSDP checkpoints into a single combined checkpoint. "
                     "Weights will be saved to `{output_path}`.")


def merge_command(args: argparse.Namespace) -> None:
    """Merge a sharded checkpoint's model into full weights (``merge_fsdp_weights``)."""
    merge_fsdp_weights(args.checkpoint_directory, args.output_path, not args.unsafe_serialization,
                       args.remove_checkpoint_dir)


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``merge-weights`` flags (registered on ``subparsers`` when given)."""
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=merge_description)
    else:
        parser = CustomArgumentParser(description=merge_description)
    parser.add_argument("checkpoint_directory", type=str, help="a folder of sharded weights (save_state / FSDP)")
    parser.add_argument("output_path", type=str, help="where to write the merged weights")
    parser.add_argument("--unsafe_serialization", action="store_true", default=False,
                        help="write .bin files rather than .safetensors (not recommended)")
    parser.add_argument("--remove_checkpoint_dir", action="store_true", default=False,
                        help="remove the checkpoint folder after merging")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


# -- accelerate.commands.utils: flags spelled with '-' or '_' ------------------------------------------------------


def _with_dash_spellings(action: argparse.Action) -> argparse.Action:
    action.option_strings = [*action.option_strings, *(
        o.replace("_", "-") for o in action.option_strings if "_" in o[2:] and o.replace("_", "-") not in action.option_strings)]
    return action


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose ``--some_flag`` flags also answer to ``--some-flag``."""

    def _add_action(self, action: argparse.Action) -> argparse.Action:
        return super()._add_action(_with_dash_spellings(action))


class CustomArgumentParser(argparse.ArgumentParser):
    """A parser whose ``--some_flag`` flags also answer to ``--some-flag`` (in its groups too)."""

    def _add_action(self, action: argparse.Action) -> argparse.Action:
        return super()._add_action(_with_dash_spellings(action))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        """A group whose flags also answer to their dash spelling."""
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group


# -- accelerate.commands.launch: help helpers -----------------------------------------------------------------------
FORMAT = "%(message)s"
#: the launch flag that shows a group of flags in ``--help`` -> the group's title
options_to_group = {"multi_gpu": "Distributed GPUs", "tpu": "TPU", "use_deepspeed": "DeepSpeed Arguments",
                    "use_fsdp": "FSDP Arguments", "use_megatron_lm": "Megatron-LM Arguments",
                    "fp8_backend": "FP8 Arguments"}


def clean_option(option: str) -> str | None:
    """A ``--flag-name`` as its setting name (``flag_name``); None for what is not a long flag."""
    if "fp8_backend" in option:
        option = "--fp8_backend"
    return option[2:].replace("-", "_") if option.startswith("--") else None


class CustomHelpFormatter(argparse.HelpFormatter):
    """Launch help that lists each flag once, by its underscore spelling, and drops empty sections."""

    def add_argument(self, action: argparse.Action) -> None:
        """Format ``action`` under its underscore spellings only."""
        shown = [o for o in action.option_strings if "-" not in o[2:]]
        if shown != action.option_strings and shown:
            action = argparse.Action(shown, action.dest, nargs=action.nargs, help=action.help, metavar=action.metavar)
        super().add_argument(action)


def _launch(args: argparse.Namespace) -> None:
    launch_command(args)


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Run the script of a parsed ``launch --use_deepspeed`` namespace: ``overdrive launch``."""
    _launch(args)


# -- accelerate.commands.estimate ---------------------------------------------------------------------------------------


def check_has_model(error: BaseException) -> str:
    """Which library raised ``error`` on a model it could not find: ``"timm"``, ``"transformers"`` or
    ``"unknown"``."""
    message = str(error)
    if is_timm_available() and ((isinstance(error, RuntimeError) and "Unknown model" in message)
                                or type(error).__name__ == "EntryNotFoundError"
                                or (isinstance(error, KeyError) and "architecture" in message)):
        return "timm"
    if is_transformers_available() and isinstance(error, (OSError, ValueError)) and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message):
        return "transformers"
    return "unknown"


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """``rows`` under ``headers`` and ``title`` as a box-drawn table, columns centred."""
    widths = [max(len(str(value)) for value in [*(row[i] for row in rows), headers[i]]) for i in range(len(headers))]
    if len(title) > sum(widths) + len(widths) - 1:
        widths[-1] += len(title) - (sum(widths) + len(widths) - 1)
    inner = sum(widths) + len(widths) - 1

    def line(cells: list) -> str:
        return "│" + "│".join(str(cell).center(width) for cell, width in zip(cells, widths, strict=True)) + "│"

    return "\n".join([
        "┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", "├" + "┬".join("─" * w for w in widths) + "┤",
        line(headers), "├" + "┼".join("─" * w for w in widths) + "┤", *(line(row) for row in rows),
        "└" + "┴".join("─" * w for w in widths) + "┘"])


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: str | None = None) -> dict[str, int]:  # noqa: A002
    """Bytes to train a model of ``bytes`` (fp32) with Adam at batch size 1, by part: model, gradients,
    optimizer, step (``-1`` for an unknown ``mixed_precision``; mixed precision keeps fp32 master weights)."""
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=bytes * 2, step=bytes * 4)
    elif mixed_precision in ("float16", "bfloat16", "fp8"):
        sizes.update(model=bytes, gradients=bytes + bytes // 2, optimizer=bytes * 2, step=bytes * 2)
    return sizes


# -- accelerate.commands.to_fsdp2 -------------------------------------------------------------------------------------


def _key_mapping() -> dict[str, Any]:
    kept = ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_cpu_ram_efficient_loading",
            "fsdp_offload_params", "fsdp_state_dict_type", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
            "fsdp_activation_checkpointing")
    dropped = {key: ConversionStatus.NOT_YET_IMPLEMENTED if key == "fsdp_forward_prefetch" else ConversionStatus.REMOVED
               for key in DROPPED}
    return {**{key: key for key in kept}, "fsdp_sharding_strategy": "fsdp_reshard_after_forward", **dropped}


def _value_mapping() -> dict[str, dict[str, bool]]:
    return {"fsdp_sharding_strategy": dict(RESHARD), "fsdp_reshard_after_forward": dict(RESHARD)}


#: FSDP1 config key -> its FSDP2 key, or why it has none (``ConversionStatus``)
ARGUMENT_KEY_MAPPING = _key_mapping()
#: FSDP1 values of the keys whose meaning changed -> their FSDP2 values
ARGUMENT_VALUE_MAPPING = _value_mapping()
