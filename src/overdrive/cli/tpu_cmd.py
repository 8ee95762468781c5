"""``overdrive tpu-config``: Accelerate's command that sets up a TPU pod, built and printed, not run.

Accelerate's command sends setup commands to every worker of a TPU pod through ``gcloud compute tpus tpu-vm
ssh``. overdrive builds the same ``gcloud`` command line from the same flags and config file keys
(``tpu_name``, ``tpu_zone``, ``commands``, ``command_file``) and prints it, as ``--debug`` does in Accelerate;
it runs nothing, since overdrive does not train on TPUs (run the printed line yourself to set up a pod).

    overdrive tpu-config --tpu_name my-tpu --tpu_zone us-central1-a --command "ls" --debug
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from overdrive.cli import UsageError, add_flag
from overdrive.launchers import config_file as cf

#: what ``--accelerate_version`` installs: "dev" (the repository), "latest" (an upgrade) or a release number
VERSION_PATTERN = re.compile(r"^\d+(\.\d+)*([.-]?(a|b|rc|dev|post)\d*)*$")


def add_parser(sub: Any) -> None:
    """Register ``overdrive tpu-config`` with Accelerate's flags."""
    parser = sub.add_parser("tpu-config", help="print the gcloud command that sets up a TPU pod (Accelerate's)",
                            description=(__doc__ or "").split("\n\n")[0])
    add_flag(parser, "config_file", metavar="PATH", help="config file with tpu_name, tpu_zone, commands")
    add_flag(parser, "tpu_name", metavar="NAME", help="the TPU (default: the config file's tpu_name)")
    add_flag(parser, "tpu_zone", metavar="ZONE", help="its zone (default: the config file's tpu_zone)")
    add_flag(parser, "use_alpha", action="store_true", help="use 'gcloud alpha'")
    add_flag(parser, "command_file", metavar="PATH", help="a file of commands to run on the pod, one a line")
    add_flag(parser, "command", action="append", nargs="+", metavar="COMMAND",
             help="a command to run on the pod (repeatable)")
    add_flag(parser, "install_accelerate", action="store_true", help="install accelerate on the pod first")
    add_flag(parser, "accelerate_version", default="latest", metavar="VERSION",
             help="the accelerate to install: latest (default), dev, or a release such as 1.16.0")
    add_flag(parser, "debug", action="store_true", help="print the command (overdrive always prints it)")
    parser.set_defaults(run=run)


def fill_from_config(args: argparse.Namespace) -> None:
    """Complete ``args`` from the config file (``--config_file``, else the default one if there is one), as
    Accelerate does: a flag given wins."""
    source = cf.find_config(args.config_file)
    if source.path is None or not source.path.is_file():
        if args.config_file is not None:
            raise UsageError(f"--config_file {args.config_file}: the file does not exist")
        return
    try:
        config = cf.load_config(source.path)
    except cf.ConfigError as err:
        raise UsageError([str(err)]) from None
    if not args.command_file and config.get("command_file") and not args.command:
        args.command_file = config["command_file"]
    if not args.command and config.get("commands"):
        args.command = config["commands"]
    args.tpu_name = args.tpu_name or config.get("tpu_name")
    args.tpu_zone = args.tpu_zone or config.get("tpu_zone")


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The ``gcloud`` command line Accelerate's ``tpu-config`` runs for ``args`` (completed from the config)."""
    if not args.command_file and not args.command:
        raise UsageError("give the commands to run on the pod: --command COMMAND (repeatable) or --command_file "
                         "PATH (or commands / command_file in the config file)")
    if args.command_file:
        commands = Path(args.command_file).read_text().splitlines()
    else:
        commands = [line for given in args.command for line in ([given] if isinstance(given, str) else given)]
    setup = ["cd /usr/share"]
    if args.install_accelerate:
        setup.append(f"pip install {_install_spec(args.accelerate_version)}")
    missing = [name for name in ("tpu_name", "tpu_zone") if not getattr(args, name)]
    if missing:
        raise UsageError(f"no {' or '.join(missing)}: give --{' and --'.join(missing)} (or the config file's "
                         f"{' and '.join(missing)})")
    return ["gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm", "ssh", args.tpu_name,
            "--zone", args.tpu_zone, "--command", "; ".join(setup + commands), "--worker", "all"]


def _install_spec(version: str) -> str:
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    if not VERSION_PATTERN.match(version):
        raise UsageError(f"--accelerate_version {version!r} is not a version; give latest, dev or a release number "
                         "such as 1.16.0")
    return f"accelerate=={version}"


def run(args: argparse.Namespace) -> int:
    """Print the ``gcloud`` command line (Accelerate's ``--debug`` output); nothing is run."""
    fill_from_config(args)
    command = gcloud_command(args)
    print(f"Running {' '.join(command)}")
    if not args.debug:
        print("overdrive tpu-config: the command above was not run (overdrive does not drive TPUs); run it "
              "yourself to set up the pod", file=sys.stderr)
    return 0
