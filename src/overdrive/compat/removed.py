"""Accelerate's fp8 recipes removed in Accelerate 1.16.0 (with MS-AMP), kept working under their old names for
scripts written for earlier releases; reading them warns (``overdrive.compat.table.REMOVED``).

``FP8RecipeKwargs(backend="TE", ...)`` builds the ``TERecipeKwargs`` it stood for (what the Accelerator takes);
``MSAMPRecipeKwargs`` holds MS-AMP's optimisation level, which only NVIDIA GPUs run: the Accelerator refuses it,
naming the recipes it takes."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from overdrive.config.choices import invalid_choice
from overdrive.config.fp8 import TERecipeKwargs
from overdrive.config.kwargs import KwargsHandler

_OPT_LEVELS = ("O1", "O2")


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP's fp8 recipe: ``opt_level`` ``"O1"`` or ``"O2"`` (``ACCELERATE_FP8_OPT_LEVEL``, else O2)."""

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = os.environ.get("ACCELERATE_FP8_OPT_LEVEL", "O2")
        self.opt_level = str(self.opt_level).upper()
        if self.opt_level not in _OPT_LEVELS:
            raise ValueError(invalid_choice(f"opt_level={self.opt_level!r}", self.opt_level, list(_OPT_LEVELS)))


class FP8RecipeKwargs:
    """Accelerate's catch-all fp8 recipe: ``backend="TE"`` (the default; ``ACCELERATE_FP8_BACKEND``) gives a
    ``TERecipeKwargs`` of the other arguments, ``backend="MSAMP"`` an ``MSAMPRecipeKwargs``."""

    def __new__(cls, backend: str | None = None, **kwargs: Any) -> Any:  # noqa: D102
        chosen = str(backend or os.environ.get("ACCELERATE_FP8_BACKEND", "TE")).upper()
        if chosen == "TE":
            return TERecipeKwargs(**kwargs)
        if chosen == "MSAMP":
            known = {f.name for f in fields(MSAMPRecipeKwargs)}
            return MSAMPRecipeKwargs(**{k: v for k, v in kwargs.items() if k in known})
        raise ValueError(invalid_choice(f"backend={backend!r}", chosen, ["TE", "MSAMP"]))
