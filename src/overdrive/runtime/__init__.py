"""Where code runs: the process's place in the job, its device, and the process group."""

from overdrive.runtime.cluster import ProcessInfo, detect_process_info
from overdrive.runtime.device import backend_for, select_device
from overdrive.runtime.process_group import ensure_process_group

__all__ = ["ProcessInfo", "detect_process_info", "select_device", "backend_for", "ensure_process_group"]
