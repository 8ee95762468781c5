"""The ``Accelerator`` facade (Accelerate's ``accelerate.accelerator``): each verb a call into the objects below.

One module per concern: ``facade`` (construction, ``prepare``, the training step, profiling and memory),
``processes`` (process place, ranks, mesh axes), ``collectives``, ``checkpoint`` (``save_state`` /
``load_state``), ``tracking``, ``surface`` (Accelerate's attribute names), ``local_sgd`` and ``profiling``.
"""

from overdrive.accelerator.facade import Accelerator
from overdrive.config import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProfileKwargs,
    ProjectConfiguration,
)

# names of accelerate.accelerator that Accelerate's tests patch; prepare_model reads them from here
from overdrive.helpers.imports import is_bitsandbytes_multi_backend_available, is_xpu_available
from overdrive.helpers.logging import get_logger
from overdrive.training.optimizer import AcceleratedOptimizer
from overdrive.training.scheduler import AcceleratedScheduler
from overdrive.training.state import AcceleratorState, GradientState

# Accelerate's accelerate.accelerator module holds these names too (its own test scripts import
# DataLoaderConfiguration and GradientAccumulationPlugin from it)
#: Accelerate's module logger (``accelerate.accelerator.logger``), process-aware
logger = get_logger("accelerate.accelerator")

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler", "Accelerator", "AcceleratorState", "DataLoaderConfiguration",
           "GradientAccumulationPlugin", "GradientState", "ProfileKwargs", "ProjectConfiguration",
           "is_bitsandbytes_multi_backend_available", "is_xpu_available"]
