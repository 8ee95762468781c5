"""``overdrive tpu-config``: Accelerate's command for running setup commands on a TPU pod, refused here.

overdrive runs on CPUs and GPUs through torch.distributed; TPUs (torch_xla) are not supported, so there
is no pod to configure. The flags Accelerate takes are accepted so that the refusal, not a flag error, is
what a user sees.
"""

from __future__ import annotations

import argparse
from typing import Any

from overdrive.cli import UsageError, add_flag


def add_parser(sub: Any) -> None:
    """Register ``overdrive tpu-config`` with Accelerate's flags."""
    parser = sub.add_parser("tpu-config", help="(refused) run commands on a TPU pod: TPUs are not supported",
                            description=(__doc__ or "").split("\n\n")[0])
    for name in ("config_file", "tpu_name", "tpu_zone", "command_file", "accelerate_version"):
        add_flag(parser, name, metavar="VALUE")
    add_flag(parser, "command", action="append", metavar="COMMAND")
    for name in ("use_alpha", "install_accelerate", "debug"):
        add_flag(parser, name, action="store_true", default=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Refuse, saying why and what to use instead."""
    raise UsageError("TPUs are not supported by overdrive (it runs on CPUs and GPUs through torch.distributed), so "
                     "there is no TPU pod to configure; to start training on GPU or CPU machines use "
                     "'overdrive launch' on each machine (see 'overdrive launch --help')")
