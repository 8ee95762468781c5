"""The registry of what an Accelerator prepared, and the state it hands to ``checkpoint/``.

``prepare()`` records each model, optimizer, scheduler and data loader here, in order, and
``register_for_checkpointing`` adds custom objects. ``save_state`` and ``load_state`` receive a
:class:`TrainingState` built from these public objects (each piece ``Stateful``: ``state_dict`` /
``load_state_dict``), in the manner of torchtitan's ``CheckpointManager(states=...)`` and Fabric's
``save(path, state)``; the checkpoint code never reaches into the Accelerator.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from overdrive.config import ProjectConfiguration
from overdrive.training.accumulation import AccumulationWindow


class PreparedObjects:
    """Models, optimizers, schedulers, data loaders and custom objects, in the order they were added;
    plus the save / load pre-hooks that may edit what a checkpoint holds."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        #: ids of ``models``: ``accumulate`` checks its arguments against them on every micro-batch
        self.model_ids: set[int] = set()
        self.optimizers: list[Any] = []  # AcceleratedOptimizer
        self.schedulers: list[Any] = []  # AcceleratedScheduler
        self.dataloaders: list[Any] = []  # prepared loaders (state_dict / load_state_dict)
        #: objects with state_dict() / load_state_dict() given to ``register_for_checkpointing``
        self.custom_objects: list[Any] = []
        #: ``hook(models, weights, output_dir)`` before each save, by handle id
        self.save_hooks: collections.OrderedDict[int, Callable[..., None]] = collections.OrderedDict()
        #: ``hook(models, input_dir)`` before each load, by handle id
        self.load_hooks: collections.OrderedDict[int, Callable[..., None]] = collections.OrderedDict()

    def contains(self, obj: Any) -> bool:
        """Whether ``obj`` (by identity) is one of the prepared models, optimizers, schedulers or loaders."""
        return any(obj is seen for seen in (*self.models, *self.optimizers, *self.schedulers, *self.dataloaders))

    def add_model(self, model: nn.Module) -> None:
        """Record a prepared model (in order)."""
        self.models.append(model)
        self.model_ids.add(id(model))

    @staticmethod
    def add_hook(hooks: collections.OrderedDict[int, Callable[..., None]],
                 hook: Callable[..., None]) -> RemovableHandle:
        """File ``hook`` in ``hooks`` (``save_hooks`` or ``load_hooks``); the handle's ``remove()`` takes it out."""
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def clear(self) -> None:
        """Forget the prepared models, optimizers, schedulers and loaders (``free_memory``); registered
        objects and hooks stay, as in Accelerate."""
        self.models.clear()
        self.model_ids.clear()
        self.optimizers.clear()
        self.schedulers.clear()
        self.dataloaders.clear()


class TrainingState:
    """Everything ``save_state`` saves and ``load_state`` restores, handed over by the Accelerator.

    Every piece is public and ``Stateful`` or plain: the prepared objects, the accumulation window
    (step and window counters), the run's project configuration (``iteration`` counts saves; the run's own,
    mutable: save_state advances it), the loss scaler, the strategy's engine checkpoint (DeepSpeed:
    ``StrategyBase.engine_checkpoint``, None for most strategies) for the objects the engine saves itself, and
    ``unwrap_model``: the user's module inside a prepared one (save hooks see the unwrapped state dicts).
    """

    def __init__(self, *, objects: PreparedObjects, window: AccumulationWindow, project: ProjectConfiguration,
                 device: torch.device, process_index: int = 0, local_process_index: int = 0, scaler: Any = None,
                 engine: Any = None, unwrap_model: Callable[[nn.Module], nn.Module] = lambda model: model) -> None:
        self.objects = objects
        self.window = window
        self.project = project
        self.device = device
        self.process_index = process_index
        self.local_process_index = local_process_index
        self.scaler = scaler
        self.engine = engine
        self.unwrap_model = unwrap_model

    def hook_models(self) -> list[nn.Module]:
        """The models the save / load pre-hooks receive, as Accelerate hands them (its ``_models``): the
        user's module inside a DDP wrapper, the engine itself for a model an engine owns (DeepSpeed)."""
        engine = self.engine
        return [model if engine is not None and engine.owns(model) else self.unwrap_model(model)
                for model in self.objects.models]

    @property
    def counters(self) -> dict[str, int]:
        """The step and window counters and the next checkpoint iteration, as a checkpoint stores them."""
        return {**self.window.state_dict(), "iteration": self.project.iteration + 1}

    def load_counters(self, counters: dict[str, Any]) -> None:
        """Restore :attr:`counters` as saved."""
        self.window.load_state_dict(counters)
        self.project.iteration = int(counters["iteration"])
