"""The objects one training loop runs through, below the strategies and the data loaders: the process and
gradient state with Accelerate's names (``state.py``), the gradient-accumulation window (``accumulation.py``),
the registry of prepared objects and the ``TrainingState`` handed to ``checkpoint/`` (``prepared.py``), and
the prepared optimizer and LR scheduler (``optimizer.py``, ``scheduler.py``).

Accelerate's paths ``accelerate.state``, ``accelerate.optimizer`` and ``accelerate.scheduler`` (and
``overdrive.state``, ...) are these very modules, served from the compat table (``compat/table.py``).
"""
