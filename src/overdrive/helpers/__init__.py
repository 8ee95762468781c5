"""Helpers over torch and the runtime that every layer above may use: seeds and RNG states (``random``),
device memory (``memory``), the environment (``environment``), which optional packages are installed
(``imports``) and the user's module from inside wrappers (``unwrap``). Accelerate's ``accelerate.utils.random`` and
``accelerate.utils.memory`` are these very modules (``overdrive.compat.table.SAME_MODULE``)."""
