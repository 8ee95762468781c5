"""Accelerate's ``accelerate.hooks`` names, from :mod:`overdrive.big_model` (re-exports only)."""

from overdrive.big_model.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
)
from overdrive.big_model.casting import LayerwiseCastingHook
from overdrive.big_model.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = ["LayerwiseCastingHook", "ModelHook", "SequentialHook", "AlignDevicesHook", "CpuOffload",
           "UserCpuOffloadHook", "add_hook_to_module", "remove_hook_from_module", "remove_hook_from_submodules",
           "attach_align_device_hook",
           "attach_align_device_hook_on_blocks", "attach_execution_device_hook"]
