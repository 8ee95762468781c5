"""``overdrive doctor``: check what makes multi-process jobs fail before they start, and say what to fix.

Run it on every machine with the flags (or config file) you launch with::

    overdrive doctor --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1 --checkpoint_dir /shared/runs

Each check prints ``ok``, ``warn`` or ``FAIL`` and, when something is wrong, what to do. The exit status is
1 when a check failed. Nothing here imports torch, so it answers in well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overdrive.cli import UsageError, add_flag
from overdrive.launchers import config_file as cf
from overdrive.launchers.settings import by_name

DEFAULT_PORT = 29500
MIN_FREE_BYTES = 1 << 30  # below 1 GiB free a checkpoint of any real model fails half-way
MARKERS = ".overdrive_doctor"


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` is "ok", "warn" or "FAIL"; ``fix`` says what to do (empty when ok)."""

    name: str
    status: str
    detail: str
    fix: str = ""


def add_parser(sub: Any) -> None:
    """Register ``overdrive doctor`` and its flags (the launch settings it checks) on ``sub``."""
    parser = sub.add_parser("doctor", help="check ports, names, the rendezvous, interfaces and disk before a job",
                            description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    add_flag(parser, "config_file", metavar="PATH", help="the config file launch would read")
    add_flag(parser, "num_machines", metavar="N", help="machines taking part (default: config file, else 1)")
    add_flag(parser, "machine_rank", metavar="RANK", help="this machine's rank (default: config file, else 0)")
    add_flag(parser, "main_process_ip", metavar="ADDR", help="address of the machine of rank 0")
    add_flag(parser, "main_process_port", metavar="PORT", help=f"port of the rendezvous (default {DEFAULT_PORT})")
    add_flag(parser, "checkpoint_dir", metavar="DIR", help="where checkpoints will be written (default: here)")
    add_flag(parser, "timeout", metavar="SECONDS", help="how long to try to reach the main machine (default 3)")
    add_flag(parser, "together", action="store_true", default=False,
             help="run on every machine at the same time: compare versions and clocks across the machines and "
                  "run a tiny all-reduce between them (imports torch; waits up to --timeout for the others)")
    parser.set_defaults(run=run)


def _setting(args: argparse.Namespace, config: dict[str, Any], name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    if value is None:
        value = config.get(name)
    return default if value is None else value


def check_hostname(num_machines: int = 1) -> Check:
    """Whether this machine's name resolves, and (with several machines) not to a loopback address."""
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        return Check("hostname", "FAIL", f"this machine's name {host!r} does not resolve ({exc})",
                     f"add '{host}' to /etc/hosts or fix DNS; torch's rendezvous looks itself up by name")
    if address.startswith("127.") and num_machines > 1:
        return Check("hostname", "warn", f"{host!r} resolves to {address} (a loopback address)",
                     "other machines cannot reach that address; map the name to the machine's network address")
    return Check("hostname", "ok", f"{host!r} resolves to {address}")


def check_port(port: int) -> Check:
    """Whether the rendezvous ``port`` can be opened here (checked on the machine of rank 0)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return Check("port", "FAIL", f"port {port} cannot be opened on this machine ({exc.strerror})",
                         "another job (or a leftover worker) holds it: stop it, or choose another "
                         "--main_process_port on every machine")
    return Check("port", "ok", f"port {port} is free on this machine")


def check_rendezvous(address: str, port: int, timeout: float) -> Check:
    """Whether the main machine's ``address``:``port`` answers within ``timeout`` seconds (from a machine of
    rank > 0, after the main machine's launch has opened it)."""
    try:
        resolved = socket.gethostbyname(address)
    except OSError as exc:
        return Check("rendezvous", "FAIL", f"--main_process_ip {address!r} does not resolve ({exc})",
                     "give the main machine's IP address, or a name every machine resolves")
    try:
        with socket.create_connection((resolved, port), timeout=timeout):
            pass
    except OSError as exc:
        return Check("rendezvous", "FAIL", f"{address}:{port} cannot be reached from here ({exc})",
                     "start the main machine's launch first (it opens the port); check firewalls and that "
                     "both machines use the same --main_process_port")
    return Check("rendezvous", "ok", f"{address}:{port} ({resolved}) answers")


def check_interfaces(num_machines: int) -> list[Check]:
    """Whether ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name interfaces this machine has; without
    them, a warning when several machines may pick different interfaces."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    found = []
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        wanted = os.environ.get(variable)
        if not wanted:
            continue
        missing = [n for n in wanted.lstrip("^=").split(",") if n and n not in names and not wanted.startswith("^")]
        if missing:
            found.append(Check("interface", "FAIL", f"{variable}={wanted} names {', '.join(missing)}, which this "
                               f"machine does not have (it has {', '.join(names) or 'none'})",
                               f"set {variable} to one of the interfaces above, or unset it"))
        else:
            found.append(Check("interface", "ok", f"{variable}={wanted}"))
    if not found:
        outside = [n for n in names if n != "lo"]
        if num_machines > 1 and len(outside) > 1:
            found.append(Check("interface", "warn", f"several network interfaces ({', '.join(outside)}) and no "
                               "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME", "set them to the interface the machines "
                               "share, or gloo/NCCL may pick one the others cannot reach"))
        else:
            found.append(Check("interface", "ok", f"interfaces: {', '.join(names) or 'unknown'}"))
    return found


def check_disk(folder: Path) -> list[Check]:
    """Whether the checkpoint ``folder`` exists, has 1 GiB free and is writable (a probe file, removed)."""
    folder = folder.expanduser().absolute()
    if not folder.is_dir():
        existing = next((p for p in folder.parents if p.exists()), Path("/"))
        return [Check("checkpoint folder", "FAIL", f"{folder} does not exist (nearest existing folder: {existing})",
                      "create it (on a shared file system: mounted on every machine), or correct --checkpoint_dir")]
    usage = shutil.disk_usage(folder)
    checks = []
    if usage.free < MIN_FREE_BYTES:
        checks.append(Check("disk", "FAIL", f"{usage.free / 2**30:.2f} GiB free under {folder}",
                            "free space or choose another checkpoint folder: a save needs the size of the "
                            "model and optimizer state, once more while it replaces an older checkpoint"))
    else:
        checks.append(Check("disk", "ok", f"{usage.free / 2**30:.1f} GiB free under {folder}"))
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        checks.append(Check("writable", "FAIL", f"{folder} cannot be written by this user ({exc.strerror})",
                            "choose a folder you can write, or fix its permissions"))
    else:
        checks.append(Check("writable", "ok", f"a file was created in {folder} and removed"))
    return checks


def check_shared(folder: Path, num_machines: int) -> Check:
    """With several machines: leave a marker with this machine's name in ``folder/.overdrive_doctor`` and list
    the other machines' markers; the machine that sees all of them removes the markers. One machine: nothing
    to share, nothing written."""
    folder = folder.expanduser().absolute()
    if num_machines == 1:
        return Check("shared folder", "ok", f"one machine: {folder} is local to it")
    if not folder.is_dir():
        return Check("shared folder", "FAIL", f"{folder} does not exist here", "see the checkpoint folder above")
    markers = folder / MARKERS
    host = socket.gethostname()
    try:
        markers.mkdir(exist_ok=True)
        (markers / f"{host}.json").write_text(json.dumps({"host": host, "time": time.time()}))
    except OSError as exc:
        return Check("shared folder", "FAIL", f"cannot write in {markers} ({exc.strerror})",
                     "checkpoints are written there too: choose a writable folder")
    seen = sorted(p.stem for p in markers.glob("*.json"))
    if len(seen) < num_machines:
        return Check("shared folder", "warn", f"{markers} holds markers of {', '.join(seen)} only, of "
                     f"{num_machines} machines", "run overdrive doctor on every machine; a machine whose marker "
                     "never shows up here does not share this folder: use save_on_each_node=True, or a shared "
                     f"file system for checkpoints (the last machine to run removes {MARKERS})")
    shutil.rmtree(markers, ignore_errors=True)
    return Check("shared folder", "ok", f"seen from here: {', '.join(seen)} (every machine shares {folder})")


def run_checks(num_machines: int, machine_rank: int, address: str | None, port: int, folder: Path,
               timeout: float, together: bool = False) -> list[Check]:
    """Run the checks that apply to this machine (the port on rank 0, the rendezvous on the others, or with
    ``together`` the meeting of every machine's doctor) and return every finding, in the order printed."""
    checks = [check_hostname(num_machines)]
    if machine_rank == 0:
        checks.append(check_port(port))
    if num_machines > 1:
        if not address:
            checks.append(Check("rendezvous", "FAIL", "several machines but no --main_process_ip",
                                "give the address of the machine of rank 0 on every machine"))
        elif machine_rank > 0 and not together:  # together: the doctors' own meeting checks the port
            checks.append(check_rendezvous(address, port, timeout))
    checks += check_interfaces(num_machines)
    checks += check_disk(folder)
    checks.append(check_shared(folder, num_machines))
    return checks


def run(args: argparse.Namespace) -> int:
    """``overdrive doctor``: read the flags and config file, run the checks, print each finding with its fix;
    returns 1 when a check failed, else 0."""
    source = cf.find_config(getattr(args, "config_file", None))
    config = cf.load_config(source.path) if source.path and source.path.is_file() else {}
    problems: list[str] = []
    values = {}
    settings = by_name()
    for name, default in (("num_machines", 1), ("machine_rank", 0), ("main_process_port", DEFAULT_PORT)):
        value, problem = settings[name].check(f"--{name}", _setting(args, config, name, default))
        values[name] = value
        if problem:
            problems.append(problem)
    timeout, problem = settings["timeout"].check("--timeout", args.timeout if args.timeout is not None else 3.0)
    if problem:
        problems.append(problem)
    if problems:
        raise UsageError(problems)
    checks = run_checks(values["num_machines"], values["machine_rank"], _setting(args, config, "main_process_ip", None),
                        values["main_process_port"], Path(args.checkpoint_dir or "."), float(timeout),
                        together=bool(getattr(args, "together", False)))
    address = _setting(args, config, "main_process_ip", None)
    if getattr(args, "together", False) and values["num_machines"] > 1 and address:
        from overdrive.cli.doctor_together import check_together  # lazy: it imports torch; only --together

        checks += [Check(*found) for found in check_together(values["num_machines"], values["machine_rank"],
                                                             address, values["main_process_port"],
                                                             max(float(timeout), 30.0))]
    for check in checks:
        print(f"{check.status:>4}  {check.name}: {check.detail}")
        if check.fix:
            print(f"      fix: {check.fix}")
    failed = [c for c in checks if c.status == "FAIL"]
    print(f"overdrive doctor: {len(failed)} problem{'s' if len(failed) != 1 else ''} found" if failed else
          "overdrive doctor: nothing found that would stop a job")
    return 1 if failed else 0
