"""Running code written for Hugging Face Accelerate on overdrive.

- ``alias``: ``install_as_accelerate()`` makes ``import accelerate`` give overdrive (in this process).
- ``table``: the one table of Accelerate's module paths and names -> overdrive modules.
- ``paths``: serves Accelerate's paths under ``overdrive`` (``overdrive.utils``, ``overdrive.hooks``, ...)
  from the table; no file stands at them.
- the other modules implement Accelerate-only helpers (``other``, ``fsdp``, ``cli_launch``, ...) and the
  refusals (``refusals``, ``unsupported``) that the table names.
"""
