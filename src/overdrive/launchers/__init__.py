"""Launchers: hand processes to torchrun's machinery (``torchrun``) or start a function (``notebook``).

``notebook_launcher`` and ``debug_launcher`` start a Python function on several processes;
``overdrive launch`` (``launchers.torchrun.launch_script``) starts a script.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "notebook_launcher": "overdrive.launchers.notebook",
    "debug_launcher": "overdrive.launchers.notebook",
    "LaunchError": "overdrive.launchers.torchrun",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _EXPORTS:
        raise AttributeError(f"module 'overdrive.launchers' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
