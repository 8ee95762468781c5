"""Running code written for Hugging Face Accelerate on overdrive.

- ``alias``: ``install_as_accelerate()`` makes ``import accelerate`` give overdrive (in this process).
- ``table``: the one table of Accelerate module paths and names -> overdrive modules.
- the other modules implement Accelerate-only helpers that the thin modules at Accelerate's paths
  (``overdrive.utils.dataclasses``, ``overdrive.data_loader``, ...) re-export.
"""
