"""``overdrive lighthouse``: start torchft's lighthouse, which fault-tolerant replica groups ask at every step
which groups take part (``overdrive launch --ft_lighthouse http://HOST:PORT``).

    overdrive lighthouse --min_replicas 2 --bind 0.0.0.0:29510

It runs until stopped (Ctrl-C, SIGTERM). Start it on a machine that outlives the training machines (or on
each of them in turn): the groups train on while any one of them is lost, not while the lighthouse is.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from typing import Any

from overdrive.cli import UsageError, add_flag

#: the address the lighthouse listens on when none is given
DEFAULT_BIND = "0.0.0.0:29510"


def add_parser(sub: Any) -> None:
    """Register ``overdrive lighthouse`` on ``sub``."""
    parser = sub.add_parser("lighthouse", allow_abbrev=False,
                            help="start the torchft lighthouse of a fault-tolerant job (--ft_lighthouse)",
                            description=(__doc__ or "").split("\n\n")[0])
    add_flag(parser, "min_replicas", type=int, default=1,
             help="replica groups the first quorum waits for (the number of groups, to start them together)")
    add_flag(parser, "bind", default=DEFAULT_BIND, metavar="HOST:PORT",
             help=f"address to listen on (default {DEFAULT_BIND}; port 0: any free port)")
    add_flag(parser, "join_timeout_ms", type=int, default=60000,
             help="how long a quorum waits for groups that asked before to ask again")
    add_flag(parser, "heartbeat_timeout_ms", type=int, default=5000,
             help="a group that sends no heartbeat for this long is dropped from the quorum")
    add_flag(parser, "quorum_tick_ms", type=int, default=100, help="how often the quorum is checked")
    parser.set_defaults(run=run)


def check_lighthouse(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at the lighthouse ``address`` (``http://HOST:PORT``), or None when a server does."""
    rest = address.partition("://")[2] or address
    host, _, port = rest.rstrip("/").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as err:
        return f"{type(err).__name__}: {err}"


def _problems(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.min_replicas < 1:
        problems.append(f"--min_replicas {args.min_replicas}: give 1 or more (the replica groups to wait for)")
    host, sep, port = str(args.bind).rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        problems.append(f"--bind {args.bind!r} is not HOST:PORT; give e.g. {DEFAULT_BIND} or [::]:29510")
    for name in ("join_timeout_ms", "heartbeat_timeout_ms", "quorum_tick_ms"):
        if getattr(args, name) <= 0:
            problems.append(f"--{name} {getattr(args, name)}: give a number of milliseconds above 0")
    return problems


def run(args: argparse.Namespace) -> int:
    """Start the lighthouse, print its address and serve until stopped; returns 0."""
    problems = _problems(args)
    if problems:
        raise UsageError(problems)
    try:
        from torchft._torchft import LighthouseServer  # lazy: optional dependency
    except ImportError:
        raise UsageError("overdrive lighthouse needs the 'torchft' package, which cannot be imported here; install "
                         "it with: pip install 'overdrive[ft]' (or pip install torchft)") from None
    try:
        server = LighthouseServer(bind=args.bind, min_replicas=args.min_replicas,
                                  join_timeout_ms=args.join_timeout_ms, quorum_tick_ms=args.quorum_tick_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    except Exception as err:  # torchft raises its own (Rust) errors, e.g. an address in use
        raise UsageError(f"overdrive lighthouse: cannot listen on {args.bind} ({err})") from None
    port = server.address().rpartition(":")[2]
    host = args.bind.rpartition(":")[0]
    shown = host if host not in ("0.0.0.0", "[::]", "::") else socket.gethostname()
    print(f"overdrive lighthouse: listening at http://{shown}:{port} (min_replicas {args.min_replicas}); launch each "
          f"replica group with --ft_lighthouse http://{shown}:{port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    print("overdrive lighthouse: stopped", file=sys.stderr, flush=True)
    return 0
