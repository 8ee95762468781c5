"""Where code runs: the process's place in the job, its device, and the process group.

Names are imported on first use: a one-process run never loads the process-group module (and its watchdog).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "ProcessInfo": "overdrive.runtime.cluster",
    "detect_process_info": "overdrive.runtime.cluster",
    "select_device": "overdrive.runtime.device",
    "backend_for": "overdrive.runtime.device",
    "ensure_process_group": "overdrive.runtime.process_group",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.runtime.cluster import ProcessInfo, detect_process_info
    from overdrive.runtime.device import backend_for, select_device
    from overdrive.runtime.process_group import ensure_process_group
