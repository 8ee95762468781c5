"""``overdrive estimate-memory MODEL``: memory to load and train a model, from its config (no download).

    overdrive estimate-memory ./my-llama --dtypes float32 float16
    overdrive estimate-memory config.json --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from overdrive.cli import UsageError, add_flag

_DTYPES = ["float32", "float16", "int8", "int4"]


def add_parser(sub: Any) -> None:
    """Register ``overdrive estimate-memory`` (Accelerate's ``accelerate estimate-memory``) on ``sub``."""
    parser = sub.add_parser("estimate-memory", allow_abbrev=False,
                            help="memory needed to load / train a model, from its config (Accelerate's table)")
    parser.add_argument("model_name", help="a folder with config.json, a config file, or a cached hub name")
    add_flag(parser, "library_name", choices=["transformers", "timm"], default=None,
             help="the library that builds the model (default: transformers)")
    add_flag(parser, "dtypes", nargs="+", choices=_DTYPES, default=_DTYPES, help="the dtypes to estimate")
    add_flag(parser, "trust_remote_code", action="store_true", help="allow a model's own code (transformers)")
    add_flag(parser, "json", action="store_true", help="print the rows as JSON (sizes in bytes)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``overdrive estimate-memory``: build the model on the meta device from its config and print the memory
    table (or JSON with ``--json``); returns 0. A model that cannot be built is a ``UsageError``."""
    # lazy: it imports torch; `overdrive --help` builds this parser
    from overdrive.big_model.estimate import create_empty_model, estimate_memory, format_table

    try:
        model = create_empty_model(args.model_name, args.library_name, args.trust_remote_code)
    except (ValueError, ImportError) as err:
        raise UsageError(str(err)) from None
    rows = estimate_memory(model, args.dtypes)
    if args.json:
        print(json.dumps({"model": args.model_name, "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))
    else:
        print(format_table(args.model_name, rows))
    return 0
