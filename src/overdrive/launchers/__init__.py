"""Launchers: hand processes to torchrun's machinery (``torchrun``) or start a function (``notebook``).

``notebook_launcher`` and ``debug_launcher`` start a Python function on several processes;
``overdrive launch`` (``launchers.torchrun.launch_script``) starts a script.
"""

from __future__ import annotations

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "notebook_launcher": "overdrive.launchers.notebook",
    "debug_launcher": "overdrive.launchers.notebook",
    "test_launch": "overdrive.launchers.notebook",
    "LaunchError": "overdrive.launchers.torchrun",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


