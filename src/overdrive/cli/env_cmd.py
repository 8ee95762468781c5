"""``overdrive env``: versions, devices and the config file in use, to paste into a bug report."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
from typing import Any

from overdrive._version import ACCELERATE_API_VERSION, __version__
from overdrive.cli import add_flag
from overdrive.launchers import config_file as cf


def add_parser(sub: Any) -> None:
    """Register ``overdrive env`` (Accelerate's ``accelerate env``) on ``sub``."""
    parser = sub.add_parser("env", help="print versions, devices and the config, for bug reports",
                            allow_abbrev=False)
    add_flag(parser, "config_file", metavar="PATH", help="the config file to show (default: the one launch reads)")
    parser.set_defaults(run=run)


def _version(name: str) -> str:
    from importlib import metadata  # lazy: `overdrive --help` builds this parser; it loads email and zipfile

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> list[str]:
    import torch  # lazy: `overdrive --help` builds this parser; torch loads only when the report is made

    lines = []
    if torch.accelerator.is_available():
        accelerator = torch.accelerator.current_accelerator()
        kind = accelerator.type if accelerator else "?"
        count = torch.accelerator.device_count()
        names = []
        module = getattr(torch, kind, None)
        for index in range(count):
            get_name = getattr(module, "get_device_name", None)
            names.append(get_name(index) if get_name else f"{kind}:{index}")
        lines.append(f"- Accelerator: {kind}, {count} device(s): {', '.join(names)}")
    else:
        lines.append("- Accelerator: none (torch.accelerator finds no device; training runs on the CPU)")
    import torch.distributed as dist  # lazy: as torch above

    backends = [name for name, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                      ("mpi", dist.is_mpi_available())) if ok]
    lines.append(f"- torch.distributed backends: {', '.join(backends) or 'none'}")
    return lines


def _memory_gib() -> tuple[float, float] | None:
    """This machine's RAM and what is available now, in GiB (from /proc/meminfo; None elsewhere)."""
    try:
        fields = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
        total, available = (int(fields[key].split()[0]) * 1024 / 2**30 for key in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        return None
    return total, available


_LIBRARIES = ("transformers", "deepspeed", "torchao", "safetensors", "peft", "trl", "accelerate")


def report(config_file: str | None = None) -> str:
    """The text ``overdrive env`` prints."""
    import torch  # lazy: `overdrive --help` builds this parser; torch loads only when the report is made

    memory = _memory_gib()

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    lines = [
        "Copy and paste the text below into your bug report.",
        "",
        f"- overdrive version: {__version__}",
        f"- Platform: {platform.platform()}",
        f"- Python version: {sys.version.split()[0]} ({sys.executable})",
        f"- PyTorch version: {torch.__version__}",
        f"- numpy version: {_version('numpy')}, PyYAML version: {_version('pyyaml')}",
        f"- CPU cores: {os.cpu_count()} ({usable} usable by this process), torch threads: {torch.get_num_threads()}",
        f"- System RAM: {memory[0]:.2f} GiB ({memory[1]:.2f} GiB available)" if memory else "- System RAM: unknown",
        *_devices(),
        "- Libraries: " + ", ".join(f"{name} {_version(name)}" for name in _LIBRARIES)
        + " (accelerate: the real package, if any; overdrive follows Accelerate's API "
        + f"{ACCELERATE_API_VERSION})",
        f"- `overdrive` command: {shutil.which('overdrive') or 'not on PATH'}",
    ]
    source = cf.find_config(config_file)
    lines.append(f"- Config file: {source.describe()}")
    if source.path is not None:
        try:
            config = cf.load_config(source.path)
            lines += [f"\t- {key}: {value}" for key, value in sorted(config.items())]
        except cf.ConfigError as err:
            lines.append(f"\t- cannot be used: {err}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``overdrive env``: print the report for bug reports (versions, devices, the config file); returns 0."""
    print(report(args.config_file))
    return 0
