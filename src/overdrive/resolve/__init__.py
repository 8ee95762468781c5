"""The resolver: constructor arguments + the launch config + the environment -> frozen, typed plans.

Besides the launcher and the CLI, this package is the only place that reads ``os.environ``. Every problem
is reported at once, each naming the value given and the valid choices. One file per step:

- ``process``: where this process runs (``ProcessPlan``, ``resolve_process``); used by ``PartialState``
- ``training``: everything an ``Accelerator`` does differently from plain PyTorch, one ``_resolve_*`` step
  per setting (``resolve_training``)
- ``handlers``: the kwargs handlers sorted by kind (``split_kwargs_handlers``)
- ``plan``: the frozen values it produces (``TrainingPlan`` and each strategy's typed settings)
- ``parallelism``: the strategy and mesh sizes; ``megatron``: the step for its plugin; ``fault_tolerance``:
  torchft's replica groups (``--ft_lighthouse``). DeepSpeed's configuration is its strategy's
  (``strategies/deepspeed/``), whose step ``resolve_training`` is handed

Names are imported on first use, so ``PartialState`` loads ``process`` without the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "LAUNCH_CONFIG_VAR": "overdrive.launchers.protocol",
    "launch_config": "overdrive.launchers.protocol",
    "ProcessPlan": "overdrive.resolve.process",
    "resolve_process": "overdrive.resolve.process",
    "SingleSettings": "overdrive.resolve.plan",
    "DDPSettings": "overdrive.resolve.plan",
    "FaultTolerantSettings": "overdrive.resolve.fault_tolerance",
    "FSDP2Settings": "overdrive.resolve.sharded_settings",
    "PipelineStrategySettings": "overdrive.resolve.sharded_settings",
    "TrainingPlan": "overdrive.resolve.plan",
    "resolve_parallelism": "overdrive.resolve.parallelism",
    "resolve_training": "overdrive.resolve.training",
    "split_kwargs_handlers": "overdrive.resolve.handlers",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, launch_config
    from overdrive.resolve.fault_tolerance import FaultTolerantSettings
    from overdrive.resolve.handlers import split_kwargs_handlers
    from overdrive.resolve.parallelism import resolve_parallelism
    from overdrive.resolve.plan import DDPSettings, SingleSettings, TrainingPlan
    from overdrive.resolve.process import ProcessPlan, resolve_process
    from overdrive.resolve.sharded_settings import FSDP2Settings, PipelineStrategySettings
    from overdrive.resolve.training import resolve_training
