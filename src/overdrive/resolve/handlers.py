"""The resolver's first step: the ``kwargs_handlers`` given to the Accelerator, sorted by kind."""

from __future__ import annotations

from typing import Any


def _handler_slots() -> dict[type, str]:
    """Each kwargs handler class -> its slot (imported when handlers are given: without them, the fp8 and
    compile settings modules stay unloaded)."""
    from overdrive.config import (  # lazy: these names load config's fp8 and compile modules
        ActivationCheckpointingKwargs,
        AORecipeKwargs,
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
        TERecipeKwargs,
    )

    return {
        DistributedDataParallelKwargs: "ddp",
        GradScalerKwargs: "scaler",
        AutocastKwargs: "autocast",
        ProfileKwargs: "profile",
        InitProcessGroupKwargs: "init",
        AORecipeKwargs: "fp8",
        TERecipeKwargs: "fp8",
        ActivationCheckpointingKwargs: "checkpointing",
    }


def split_kwargs_handlers(handlers: list[Any] | None) -> dict[str, Any]:
    """Sort kwargs handlers by kind; a kind given twice or an unknown object is an error."""
    found: dict[str, Any] = {}
    slots = _handler_slots() if handlers else {}
    for handler in handlers or []:
        slot = slots.get(type(handler))
        if slot is None:
            valid = ", ".join(cls.__name__ for cls in slots)
            raise ValueError(f"kwargs_handlers got {handler!r}, which is not valid; choose from {valid}")
        if slot == "fp8" and slot in found:
            raise ValueError(f"kwargs_handlers has two fp8 recipes ({type(found[slot]).__name__} and "
                             f"{type(handler).__name__}); give one")
        if slot in found:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__} objects; give one")
        found[slot] = handler
    return found
