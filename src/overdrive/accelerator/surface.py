"""The attributes of Accelerate's ``Accelerator`` that libraries and scripts read, over overdrive's objects.

``Accelerator`` inherits them, so the facade keeps its own short methods: transformers reads
``accelerator._models``, scripts read ``native_amp``, ``ddp_handler`` and the other ``*_handler``
attributes, ``rng_types``, ``log_with``, ``project_dir`` and the data-loader settings. Each is
a view of the resolved plan, of the prepared-objects registry or of the Accelerator's own run settings
(``project_configuration``, ``dataloader_config``), never a second copy.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from overdrive.helpers.unwrap import extract_model_from_parallel
from overdrive.resolve.plan import DDPSettings

if TYPE_CHECKING:
    from overdrive.config import DataLoaderConfiguration, ProjectConfiguration
    from overdrive.precision.amp import AmpPrecision
    from overdrive.resolve.plan import TrainingPlan
    from overdrive.training.prepared import PreparedObjects


class AccelerateSurface:
    """Accelerate's attribute names on an object with ``plan``, ``prepared``, ``precision``,
    ``project_configuration`` and ``dataloader_config``."""

    plan: TrainingPlan
    prepared: PreparedObjects
    precision: AmpPrecision
    project_configuration: ProjectConfiguration
    dataloader_config: DataLoaderConfiguration

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

    # -- parameters a preparation replaced (Accelerate's private helpers, which its tests call) ------------
    def _get_named_parameters(self, *args: Any, drop_refs: bool = False) -> dict[str, Any]:
        """The parameters of the models among ``args`` by name (unwrapped; prefixed with the model's index
        when there are several); with ``drop_refs``, their data pointers instead of the tensors."""
        models = [obj for obj in args if isinstance(obj, nn.Module)]
        named: dict[str, Any] = {}
        for index, model in enumerate(models):
            inner = extract_model_from_parallel(model, keep_torch_compile=False)
            for name, param in inner.named_parameters(prefix=str(index) if len(models) > 1 else ""):
                named[name] = param.data_ptr() if drop_refs else param
        return named

    def _remap_optimizer_parameters(self, old_named_params: dict[str, Any], *args: Any) -> None:
        """Point the optimizers among ``args`` at the parameters their models hold now, where preparation
        replaced a parameter object (``old_named_params``: ``_get_named_parameters`` before it); their state
        moves along. Nothing changes when no parameter was replaced."""
        new = self._get_named_parameters(*args)
        mapping = {id(old): new[name] for name, old in old_named_params.items()
                   if name in new and old is not new[name]}
        if not mapping:
            return
        for optimizer in (obj for obj in args if isinstance(obj, Optimizer)):
            for group in optimizer.param_groups:
                group["params"] = [mapping.get(id(p), p) for p in group["params"]]
            state = optimizer.state
            for old_id, param in mapping.items():
                old = next((p for p in list(state) if id(p) == old_id), None)
                if old is not None:
                    state[param] = state.pop(old)

    # -- mixed precision --------------------------------------------------------------------------------
    @property
    def native_amp(self) -> bool:
        """Whether forward passes run under autocast (fp16 / bf16 mixed precision). Settable: ``False``
        turns autocast off for every prepared model from the next forward on; ``True`` turns it back on."""
        return bool(self.precision.policy.enabled and self.precision.autocast_kwargs.enabled
                    and self.precision.active)

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
        settings = self.plan.strategy_settings
        return settings.options if isinstance(settings, DDPSettings) else self.plan.ddp

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
        return self.plan.init_kwargs

    @property
    def fp8_recipe_handler(self) -> Any:
        """The fp8 recipe (``AORecipeKwargs`` / ``TERecipeKwargs``) in effect, or None."""
        return self.plan.fp8

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


    # -- placement and project folders ----------------------------------------------------------------
    @property
    def device_placement(self) -> bool:
        """Whether ``prepare`` moves models and batches to the device by default."""
        return self.plan.device_placement

    @property
    def project_dir(self) -> str | None:
        """The project folder (checkpoints go under it with automatic naming), or None."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """The folder trackers write to, or None."""
        return self.project_configuration.logging_dir

    # -- data-loader settings (a copy of the plan's, owned by this Accelerator) -----------------------
    @property
    def split_batches(self) -> bool:
        """Whether each loader's batch is split over the processes (else each process takes whole batches)."""
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether the main process reads every batch and sends each process its share (None: decided
        per loader)."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last batches are filled up so every process gets the same number (settable)."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether loaders shuffle with a sampler seeded by (seed, epoch), the same at any world size."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """Whether batches are copied to the device without waiting."""
        return self.dataloader_config.non_blocking

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """Accelerate's hook for DeepSpeed Ulysses sequence parallelism over a loader prepared apart from the
        model (transformers' Trainer calls it). overdrive refuses ``sp_size > 1`` when the Accelerator is
        built, so the loader comes back unchanged."""
        return dl
