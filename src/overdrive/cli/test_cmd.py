"""``overdrive test``: a short training run with the current config; says whether this machine can train."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from overdrive.cli import Parser, add_flag
from overdrive.cli.launch import add_launch_flags, plan_launch


def add_parser(sub: Any) -> None:
    """Register ``overdrive test`` (``accelerate test``) and the few launch flags it passes on."""
    parser = sub.add_parser("test", help="train a tiny model with the current config to check this machine",
                            description="Launch a short built-in training run (overdrive/cli/_selftest.py) with the "
                                        "config file and flags given, and say whether it trained.",
                            allow_abbrev=False)
    add_flag(parser, "config_file", metavar="PATH", help="config file to test (default: the one launch reads)")
    add_flag(parser, "num_processes", metavar="N", help="processes to test with (default: the config's)")
    add_flag(parser, "cpu", action="store_true", default=None, help="test on the CPU")
    add_flag(parser, "mixed_precision", metavar="MODE", help="no, fp16, bf16 or fp8")
    add_flag(parser, "debug", action="store_true", default=None, help="show torchrun's own log")
    parser.set_defaults(run=run)


def _launch_argv(args: argparse.Namespace, result: str) -> list[str]:
    argv = []
    for name in ("config_file", "num_processes", "mixed_precision"):
        if getattr(args, name, None) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    for name in ("cpu", "debug"):
        if getattr(args, name, None):
            argv.append(f"--{name}")
    return argv + [str(Path(__file__).with_name("_selftest.py")), result]


def run(args: argparse.Namespace) -> int:
    """``overdrive test``: launch the built-in tiny training run with the given config and flags and say
    whether this machine can train; returns 0 when it trained, else the run's exit status (or 1)."""
    # lazy: `overdrive --help` builds this parser; the launcher's machinery loads only to run
    from overdrive.launchers.torchrun import launch_script

    with tempfile.TemporaryDirectory(prefix="overdrive-test-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        parser = Parser(prog="overdrive test", allow_abbrev=False)
        add_launch_flags(parser)
        parser.add_argument("training_script")
        parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
        launch_args = parser.parse_args(_launch_argv(args, result_path))
        plan, command, summary = plan_launch(launch_args)
        print(summary.replace("overdrive launch:", "overdrive test:", 1), file=sys.stderr, flush=True)
        code = launch_script(plan, command)
        result = json.loads(Path(result_path).read_text()) if Path(result_path).is_file() else None
    if result is None:
        print(f"overdrive test: this machine CANNOT train with this config: the run failed (exit code {code}) "
              "before it finished; see the errors above", file=sys.stderr)
        return code or 1
    what = (f"{result['num_processes']} process(es) on {result['device']} ({result['backend'] or 'no process group'}), "
            f"mixed_precision={result['mixed_precision']}, loss {result['loss_first']:.4f} -> {result['loss_last']:.4f}, "
            f"ranks' weights differ by {result['weight_spread']:.1e}, {result['seconds']} s")
    if result["ok"] and code == 0:
        print(f"overdrive test: this machine can train: {what}")
        return 0
    reasons = []
    if not result["loss_fell"]:
        reasons.append("the loss did not fall by half")
    if result["weight_spread"] != 0.0:
        reasons.append("the ranks ended with different weights")
    print(f"overdrive test: this machine CANNOT train with this config ({'; '.join(reasons) or f'exit code {code}'}): "
          f"{what}", file=sys.stderr)
    return code or 1

