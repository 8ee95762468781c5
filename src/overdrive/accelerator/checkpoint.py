"""The ``Accelerator``'s checkpoint verbs: ``save_state`` / ``load_state``, ``save_model``, ``get_state_dict``,
``save``, ``register_for_checkpointing`` and the save / load hooks.

``Accelerator`` inherits them. Each hands ``checkpoint/`` one ``TrainingState`` (the prepared objects, the
accumulation window, the project settings, the scaler, the strategy's engine) or the model itself; the
checkpoint package never reads the facade.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from overdrive.accelerator.collectives import reports_hangs
from overdrive.training.prepared import TrainingState

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from overdrive.config import ProjectConfiguration
    from overdrive.strategies import StrategyBase
    from overdrive.training.accumulation import AccumulationWindow
    from overdrive.training.prepared import PreparedObjects
    from overdrive.training.state import AcceleratorState


class CheckpointVerbs:
    """Accelerate's checkpoint verbs on an object with ``prepared``, ``window``, ``project_configuration``,
    ``scaler``, ``strategy``, the process ``state`` and ``unwrap_model``."""

    prepared: PreparedObjects
    window: AccumulationWindow
    project_configuration: ProjectConfiguration
    scaler: Any
    strategy: StrategyBase
    state: AcceleratorState
    unwrap_model: Callable[..., nn.Module]

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Save ``obj`` once per machine group (on the main process), with torch.save or safetensors."""
        if not self.state.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file  # lazy: loaded only by runs that save with it

            save_file(obj, str(f), metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    @reports_hangs
    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
                   **save_model_func_kwargs: Any) -> str:
        """Save the whole training state (models, optimizers, schedulers, loss scaler, data-loader
        positions, RNG states, step counters, registered objects) to ``output_dir``; call on every process
        (or, as in Accelerate, on the main process only when it holds the whole state: one process or DDP).

        The folder holds Accelerate's files (``model.safetensors``, ``optimizer.bin``, FSDP2's and DeepSpeed's
        folders, ``random_states_<rank>.pkl``, ...) and overdrive's small extras (``state.json``,
        ``rank_<r>.json``, ``manifest.json``); it appears by one atomic rename once every process is done.
        ``layout="resharding"`` (also what ``async_save=True`` writes) writes ``torch.distributed.checkpoint``
        files instead; ``accelerate_layout=True`` / ``False`` is the older spelling. With
        ``automatic_checkpoint_naming`` the folder is ``<project_dir>/checkpoints/checkpoint_<iteration>`` and
        ``total_limit`` applies. Returns the folder.
        """
        # lazy: the checkpoint package (torch.distributed.checkpoint with it) loads only when a run uses it
        from overdrive.checkpoint import save_state

        return save_state(self.training_state(), output_dir, safe_serialization, **save_model_func_kwargs)

    @reports_hangs
    def load_state(self, input_dir: str | os.PathLike | None = None, **load_model_func_kwargs: Any) -> str:
        """Restore what ``save_state`` saved (the newest complete checkpoint when ``input_dir`` is None and
        names are automatic), or a folder the real Accelerate wrote. Keywords: ``allow_pickle`` (default
        None: Accelerate's files as Accelerate reads them, nothing of overdrive's unpickled; False: nothing
        beyond plain values; True: everything), ``strict`` (default True), ``verify`` (checksums, default
        True), ``load_kwargs`` (passed to ``torch.load``)."""
        # lazy: the checkpoint package (torch.distributed.checkpoint with it) loads only when a run uses it
        from overdrive.checkpoint import load_state

        return load_state(self.training_state(), input_dir, **load_model_func_kwargs)

    def training_state(self) -> TrainingState:
        """What ``save_state`` saves and ``load_state`` restores: the prepared and registered objects, the
        accumulation window, the project configuration, the loss scaler and the strategy's engine."""
        return TrainingState(objects=self.prepared, window=self.window, project=self.project_configuration,
                             device=self.state.device, process_index=self.state.process_index,
                             local_process_index=self.state.local_process_index, scaler=self.scaler,
                             engine=self.strategy.engine_checkpoint, unwrap_model=self.unwrap_model)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` (each with ``state_dict`` / ``load_state_dict``) with the state."""
        # lazy: the checkpoint package (torch.distributed.checkpoint with it) loads only when a run uses it
        from overdrive.checkpoint import check_stateful

        self.prepared.custom_objects.extend(check_stateful(objects))

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before each ``save_state``; a hook that saves a model
        itself pops its entry from ``weights``. Returns a handle with ``remove()``."""
        return self.prepared.add_hook(self.prepared.save_hooks, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before each ``load_state``; a hook that loads a model itself
        pops it from ``models``. Returns a handle with ``remove()``."""
        return self.prepared.add_hook(self.prepared.load_hooks, hook)

    @reports_hangs
    def save_model(self, model: nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write ``model``'s full weights as ``model.safetensors`` (or shards + index) in ``save_directory``."""
        # lazy: the checkpoint package (torch.distributed.checkpoint with it) loads only when a run uses it
        from overdrive.checkpoint import save_model

        save_model(model, save_directory, max_shard_size, safe_serialization, is_main_process=self.state.is_main_process,
                   engine=self.strategy.engine_checkpoint)

    @reports_hangs
    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """``model``'s full state dict on the CPU, by the user's parameter names (gathered when sharded)."""
        # lazy: the checkpoint package (torch.distributed.checkpoint with it) loads only when a run uses it
        from overdrive.checkpoint import get_state_dict

        return get_state_dict(model, unwrap=unwrap, engine=self.strategy.engine_checkpoint)
