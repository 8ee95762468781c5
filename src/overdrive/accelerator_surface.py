"""The attributes of Accelerate's ``Accelerator`` that libraries and scripts read, over overdrive's objects.

``Accelerator`` inherits them, so the facade keeps its own short methods: transformers reads
``accelerator._models``, scripts read ``native_amp``, ``ddp_handler`` and the other ``*_handler``
attributes, ``rng_types``, ``log_with`` and ``trackers``. Each is a view of the resolved plan or of the
prepared-objects registry, never a second copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class AccelerateSurface:
    """Accelerate's attribute names on an object with ``plan``, ``prepared`` and ``precision``."""

    plan: Any
    prepared: Any
    precision: Any

    # -- what prepare() returned (Accelerate keeps them in these private lists; libraries read them) --
    @property
    def _models(self) -> list[Any]:
        return self.prepared.models

    @property
    def _optimizers(self) -> list[Any]:
        return self.prepared.optimizers

    @property
    def _schedulers(self) -> list[Any]:
        return self.prepared.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self.prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self.prepared.custom_objects

    # -- mixed precision --------------------------------------------------------------------------------
    @property
    def native_amp(self) -> bool:
        """Whether forward passes run under autocast (fp16 / bf16 mixed precision). Settable: ``False``
        turns autocast off for every prepared model from the next forward on; ``True`` turns it back on."""
        return bool(self.precision.policy.enabled and self.precision.autocast_kwargs.enabled
                    and getattr(self.precision, "active", True))

    @native_amp.setter
    def native_amp(self, value: bool) -> None:
        if value and not self.precision.policy.enabled:
            raise ValueError(f"native_amp=True needs mixed precision; this Accelerator runs "
                             f"mixed_precision={self.plan.precision.name!r}: build it with mixed_precision='bf16' "
                             "or 'fp16'")
        self.precision.active = bool(value)  # read by the hooks of the models already prepared
        if value and not self.precision.autocast_kwargs.enabled:
            self.precision.autocast_kwargs = dataclasses.replace(self.precision.autocast_kwargs, enabled=True)

    # -- the kwargs handlers given to Accelerator(kwargs_handlers=[...]) (defaults when none) ---------
    @property
    def ddp_handler(self) -> Any:
        """The DDP options in effect (a copy of the ``DistributedDataParallelKwargs`` given, or the defaults)."""
        return getattr(getattr(self.plan, "strategy_settings", None), "options", None) or self.plan.ddp

    @property
    def scaler_handler(self) -> Any:
        """The ``GradScalerKwargs`` in effect."""
        return self.plan.scaler

    @property
    def autocast_handler(self) -> Any:
        """The ``AutocastKwargs`` in effect."""
        return self.plan.autocast

    @property
    def profile_handler(self) -> Any:
        """The ``ProfileKwargs`` given, or None."""
        return self.plan.profile

    @property
    def init_handler(self) -> Any:
        """The ``InitProcessGroupKwargs`` given, or None."""
        return getattr(self.plan, "init_kwargs", None)

    @property
    def fp8_recipe_handler(self) -> Any:
        """The fp8 recipe (``AORecipeKwargs`` / ``TERecipeKwargs``) in effect, or None."""
        return getattr(self.plan, "fp8", None)

    @property
    def has_fp8_handler(self) -> bool:
        """Whether an fp8 recipe is in effect."""
        return self.fp8_recipe_handler is not None

    # -- other settings -------------------------------------------------------------------------------
    @property
    def rng_types(self) -> list[str]:
        """The RNGs synchronised at the start of each epoch."""
        return list(self.plan.rng_types)

    @property
    def log_with(self) -> list[Any]:
        """The trackers ``log_with`` named."""
        return list(self.plan.log_with)

    @property
    def trackers(self) -> list[Any]:
        """The running trackers: empty until ``init_trackers``."""
        return self.__dict__.setdefault("_trackers", [])

    @trackers.setter
    def trackers(self, value: list[Any]) -> None:
        self.__dict__["_trackers"] = list(value)
