"""Accelerate's checks of what is installed and available on this machine (``accelerate.utils.versions`` and
``accelerate.utils.other``): package versions, free ports, the OS kernel."""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import socket

import torch
from packaging.version import Version, parse

from overdrive.compat.constants import STR_OPERATION_TO_FUNC
from overdrive.config.choices import invalid_choice


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """``library_or_version <operation> requirement_version``; a name is looked up as an installed package."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(invalid_choice(f"operation {operation!r}", operation, sorted(STR_OPERATION_TO_FUNC)))
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return bool(STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the running torch's base version satisfies ``<operation> version``."""
    return compare_versions(parse(parse(torch.__version__).base_version), operation, version)


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``port`` (default 29500) on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port or 29500)) == 0


def get_free_port() -> int:
    """A free TCP port on this machine."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def check_os_kernel() -> None:
    """Warn when the Linux kernel is older than 5.5 (processes can hang there)."""
    info = platform.uname()
    if info.system == "Linux":
        version = parse(info.release.split("-")[0])
        if version < parse("5.5.0"):
            logging.getLogger(__name__).warning(
                f"Linux kernel {version} is below 5.5.0, the recommended minimum; processes may hang")
