"""``overdrive to-fsdp2``: rewrite an Accelerate config file's FSDP1 settings as FSDP2 settings.

    overdrive to-fsdp2 --config_file fsdp1.yaml --output_file fsdp2.yaml
    overdrive to-fsdp2 --config_file cfg.yaml --overwrite

``fsdp_sharding_strategy`` becomes ``fsdp_reshard_after_forward`` (FULL_SHARD / HYBRID_SHARD: true;
SHARD_GRAD_OP / HYBRID_SHARD_ZERO2 / NO_SHARD: false); FSDP1-only keys (``fsdp_backward_prefetch``,
``fsdp_forward_prefetch``, ``fsdp_sync_module_states``, ``fsdp_use_orig_params``) are dropped and named;
everything else is kept; ``fsdp_version`` becomes 2. (overdrive runs both versions on FSDP2; the rewrite is
for files shared with Accelerate.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from overdrive.cli import UsageError, add_flag

RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False,
           "NO_SHARD": False}
DROPPED = ("fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_sync_module_states", "fsdp_use_orig_params")


def convert(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``config`` with its ``fsdp_config`` in FSDP2 form, and a note per change (unchanged when it has no FSDP
    section or is FSDP2 already)."""
    fsdp = dict(config.get("fsdp_config") or {})
    if not fsdp:
        return config, ["the file has no fsdp_config section: nothing to convert"]
    if int(fsdp.get("fsdp_version", 1)) == 2:
        return config, ["fsdp_config already says fsdp_version: 2: nothing to convert"]
    notes, out = [], {}
    strategies = [key for key in ("fsdp_reshard_after_forward", "fsdp_sharding_strategy")
                  if key in fsdp and str(fsdp[key]).upper() in RESHARD]
    for key, value in fsdp.items():
        if key in DROPPED:
            notes.append(f"dropped {key}: {value!r} (an FSDP1 setting; FSDP2 has no equivalent)")
        elif key in strategies and key != strategies[0]:  # both given: the FSDP2 key's value wins
            notes.append(f"dropped {key}: {value} (fsdp_reshard_after_forward: {fsdp[strategies[0]]} was given too "
                         "and is kept)")
        elif key in strategies:
            out["fsdp_reshard_after_forward"] = RESHARD[str(value).upper()]
            notes.append(f"{key}: {value} -> fsdp_reshard_after_forward: {str(out['fsdp_reshard_after_forward']).lower()}")
        elif key == "fsdp_version":
            notes.append(f"fsdp_version: {value} -> 2")
        else:
            out[key] = value
    out["fsdp_version"] = 2
    return {**config, "fsdp_config": out}, notes


def add_parser(sub: Any) -> None:
    """Register ``overdrive to-fsdp2`` and its flags."""
    parser = sub.add_parser("to-fsdp2", help="convert an Accelerate config file from FSDP1 to FSDP2",
                            description=(__doc__ or "").split("\n\n")[0])
    add_flag(parser, "config_file", metavar="PATH", required=True, help="the config file to convert")
    add_flag(parser, "output_file", metavar="PATH", help="where to write the result (default: --overwrite)")
    add_flag(parser, "overwrite", action="store_true", default=False, help="rewrite --config_file in place")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert the file; usage problems raise ``UsageError``."""
    import yaml  # lazy: `overdrive --help` builds this parser; PyYAML loads only when a file is converted

    source = Path(args.config_file).expanduser()
    if not source.is_file():
        raise UsageError(f"--config_file {source}: the file does not exist")
    if args.output_file is None and not args.overwrite:
        raise UsageError("give --output_file PATH, or --overwrite to rewrite --config_file in place")
    target = source if args.output_file is None else Path(args.output_file).expanduser()
    if target.exists() and target != source and not args.overwrite:
        raise UsageError(f"--output_file {target} exists already; pass --overwrite to replace it")
    try:
        config = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"--config_file {source}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise UsageError(f"--config_file {source}: expected a mapping of settings, got {type(config).__name__}")
    converted, notes = convert(config)
    for note in notes:
        print(f"overdrive to-fsdp2: {note}", file=sys.stderr)
    target.write_text(yaml.safe_dump(converted, sort_keys=True))
    print(f"overdrive to-fsdp2: wrote {target}")
    return 0
