"""The ``Accelerator`` facade (Accelerate's ``accelerate.accelerator``): each verb a call into the objects below.

One module per concern: ``facade`` (construction, ``prepare``, the training step, profiling and memory),
``processes`` (process place, ranks, mesh axes), ``collectives``, ``checkpoint`` (``save_state`` /
``load_state``), ``tracking``, ``surface`` (Accelerate's attribute names), ``local_sgd`` and ``profiling``.
"""

from overdrive.accelerator.facade import Accelerator
from overdrive.config import GradientAccumulationPlugin

__all__ = ["Accelerator", "GradientAccumulationPlugin"]
