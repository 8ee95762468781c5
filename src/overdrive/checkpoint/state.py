"""The pieces of a training run a checkpoint holds, each behind the ``Stateful`` protocol.

Models and optimizers go through ``torch.distributed.checkpoint.state_dict``: it drops DDP's
``module.`` and ``torch.compile``'s ``_orig_mod.`` prefixes, names optimizer state by parameter name
instead of position, and keeps FSDP2 / tensor-parallel ``DTensor`` shards as shards, so the same
adapters serve every strategy and a checkpoint can be resharded when it is loaded.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from overdrive.checkpoint.errors import CheckpointError

STATE, GROUPS = "state", "param_groups"


class ModelState:
    """A model's weights and buffers by their plain names (sharded when the model is)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        """The state dict by plain parameter names (``get_model_state_dict``; DTensors stay sharded)."""
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load ``state_dict`` into the model in place (``set_model_state_dict``), ``strict`` as in torch."""
        set_model_state_dict(self.model, state_dict, options=StateDictOptions(strict=strict))


class OptimizerState:
    """An optimizer's state and hyperparameters, flattened to one key per parameter and value
    (``state.<param>.<name>``, ``param_groups.<param>.<hyperparameter>``) so that every key can be
    resharded on its own, as ``StateDictOptions(flatten_optimizer_state_dict=True)`` does."""

    def __init__(self, optimizer: torch.optim.Optimizer, owner: nn.Module) -> None:
        self.optimizer = optimizer
        self.owner = owner

    @property
    def has_state(self) -> bool:
        """Whether the optimizer has stepped. Without state only the hyperparameters are saved: asking torch
        for the state dict would first create the state with an extra step."""
        return bool(self.optimizer.state)

    def nested_state_dict(self) -> dict[str, Any]:
        """The state dict keyed by parameter names (``get_optimizer_state_dict``), not flattened."""
        return get_optimizer_state_dict(self.owner, self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        """The flat state dict (see the class): one key per parameter and value."""
        return flatten_optimizer(self.nested_state_dict())

    def load_state_dict(self, state_dict: dict[str, Any], groups: list[dict[str, Any]] | None = None) -> None:
        """Load a flat state dict. Parameters without ``state.`` entries get no state (as before their
        first step); ``groups`` gives each param group's parameter names (default: the optimizer's)."""
        names: list[dict[str, Any]] = groups if groups is not None else self.nested_state_dict()[GROUPS]
        nested = unflatten_optimizer(state_dict, names)
        set_optimizer_state_dict(self.owner, self.optimizer, nested, options=StateDictOptions(strict=False))


def flatten_optimizer(nested: dict[str, Any]) -> dict[str, Any]:
    """Flatten a name-keyed optimizer state dict to ``state.<param>.<name>`` and
    ``param_groups.<param>.<hyperparameter>`` keys (the inverse of ``unflatten_optimizer``)."""
    flat: dict[str, Any] = {}
    for name, values in nested[STATE].items():
        for key, value in values.items():
            flat[f"{STATE}.{name}.{key}"] = value
    for group in nested[GROUPS]:
        for name in group["params"]:
            for key, value in group.items():
                if key != "params":
                    flat[f"{GROUPS}.{name}.{key}"] = value
    return flat


def unflatten_optimizer(flat: dict[str, Any], groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The nested form of :func:`flatten_optimizer`'s output, for param groups holding ``groups``' names."""
    names = {n for group in groups for n in group["params"]}
    state: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if not key.startswith(f"{STATE}."):
            continue
        body = key[len(STATE) + 1:]
        name, _, leaf = body.rpartition(".")
        if name not in names:  # a state value whose own name has dots: match the longest parameter name
            name = max((n for n in names if body.startswith(f"{n}.")), key=len, default="")
            if not name:
                continue
            leaf = body[len(name) + 1:]
        state.setdefault(name, {})[leaf] = value
    rebuilt = []
    for group in groups:
        names = list(group["params"])
        values = {k: flat[f"{GROUPS}.{names[0]}.{k}"] for k in group if k != "params"} if names else {}
        rebuilt.append({**{k: v for k, v in group.items() if k != "params"}, **values, "params": names})
    return {STATE: state, GROUPS: rebuilt}


def optimizer_owner(optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> nn.Module:
    """The module whose parameter names name ``optimizer``'s parameters: the prepared model that holds
    them, or a container of the several that do (and of parameters that belong to no model)."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [m for m in models if any(id(p) in params for p in m.parameters())]
    covered = {id(p) for m in owners for p in m.parameters()}
    orphans = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in covered]
    if len(owners) == 1 and not orphans:
        return owners[0]
    container = nn.Module()
    for i, model in enumerate(owners):
        container.add_module(f"model_{i}", model)
    for i, param in enumerate(orphans):
        if not isinstance(param, nn.Parameter):
            raise CheckpointError(f"an optimizer holds a tensor of shape {tuple(param.shape)} that is neither an "
                                  "nn.Parameter nor part of a prepared model, so it has no name to save it under; "
                                  "prepare the model it belongs to, or make it an nn.Parameter")
        container.register_parameter(f"unowned_{i}", param)
    return container


# -- random number generators ---------------------------------------------------------------------
def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's RNG states: Python's, NumPy's, torch's CPU generator and the device's."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    states["numpy"] = np.random.get_state()
    module = _device_module(device)
    if module is not None:
        states["device"] = {"type": device.type, "state": module.get_rng_state()}
    return states


def restore_rng(states: dict[str, Any], device: torch.device) -> None:
    """Set the Python, torch, NumPy and ``device``'s RNG states from ``states`` (as ``capture_rng`` took
    them); a device state saved on another device type is left out."""
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    saved = states.get("device")
    module = _device_module(device)
    if saved is not None and module is not None and saved["type"] == device.type:
        module.set_rng_state(saved["state"])


def _device_module(device: torch.device) -> Any:
    if device.type in ("cpu", "meta"):
        return None
    module = getattr(torch, device.type, None)
    return module if module is not None and hasattr(module, "get_rng_state") else None


# -- data loaders ---------------------------------------------------------------------------------
def loader_record(loader: Any) -> dict[str, Any]:
    """A prepared loader's position, with the global batch it was measured in."""
    return {"state": loader.state_dict(), "total_batch_size": getattr(loader, "total_batch_size", None)}


def restores_position(loader: Any) -> bool:
    """Whether ``load_state`` puts ``loader`` back at its saved position: only a loader prepared with
    ``exact_resume`` (with its generator's saved state too) or ``use_stateful_dataloader`` (torchdata's state
    dict), as in Accelerate."""
    return bool(getattr(loader, "exact_resume", False) or getattr(loader, "use_stateful_dataloader", False))


def _mid_epoch(state: dict[str, Any]) -> bool:
    return bool(state.get("iterated")) and not state.get("end_of_dataloader") and not state.get("epoch_set")


def loader_state_for(record: dict[str, Any], loader: Any, index: int) -> dict[str, Any]:
    """The saved position of loader ``index``, in batches of ``loader``'s global batch.

    Every process draws the same shuffled order at any world size, so a position is a number of samples
    of that order; it maps to another world size when it is a whole number of the new global batches.
    """
    state = dict(record["state"])
    saved, now = record.get("total_batch_size"), getattr(loader, "total_batch_size", None)
    if saved == now:
        return state
    for key in ("batches_yielded", "skip"):
        if key == "batches_yielded" and not _mid_epoch(state) or not state.get(key):
            continue
        if not saved or not now:
            raise CheckpointError(f"data loader {index}: the checkpoint's position cannot be mapped to this "
                                  "loader, whose batch size is unknown; resume with the same number of processes")
        consumed = int(state[key]) * int(saved)
        if consumed % int(now):
            raise CheckpointError(
                f"data loader {index}: the checkpoint stopped after {consumed} samples of epoch {state['epoch']} "
                f"(a global batch of {saved}); with this run's global batch of {now} that is not a whole number "
                f"of batches. Resume with a global batch that divides {consumed}, or from a checkpoint saved at "
                "the end of an epoch")
        state[key] = consumed // int(now)
    return state
