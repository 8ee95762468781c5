"""Accelerate helpers that scripts and libraries call directly although Accelerate uses them inside its own
``prepare`` / ``save_state`` / launcher: each does what Accelerate's does, over overdrive's objects."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from overdrive.compat.other import get_pretty_name, load, save
from overdrive.helpers.logging import get_logger

logger = get_logger("accelerate.checkpointing")


def save_custom_state(obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False) -> None:
    """Save ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (the file ``save_state`` writes
    for an object given to ``register_for_checkpointing``)."""
    location = Path(path) / f"custom_checkpoint_{index}.pkl"
    logger.info(f"Saving the state of {get_pretty_name(obj)} to {location}")
    save(obj.state_dict(), location, save_on_each_node=save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict`` (the file may hold any
    picklable state: it is read with ``weights_only=False``, so load only files you trust)."""
    location = Path(path) / f"custom_checkpoint_{index}.pkl"
    logger.info(f"Loading the state of {get_pretty_name(obj)} from {location}")
    obj.load_state_dict(load(location, map_location="cpu", weights_only=False))


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` built with ``kwargs`` (what fp16 under FSDP2 scales losses with)."""
    return torch.amp.GradScaler(**kwargs)


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """``named_params`` with the name parts activation checkpointing (``._checkpoint_wrapped_module``) and
    ``torch.compile`` (``_orig_mod.``) add removed, so the names match the plain model's."""
    names = {k.replace("._checkpoint_wrapped_module", ""): v for k, v in named_params.items()}
    names = {(k.replace("_orig_mod.", "") if k.startswith("_orig_mod.") else k): v for k, v in names.items()}
    return {k.replace("._orig_mod", ""): v for k, v in names.items()}


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point ``optimizer`` at new parameters in place: ``mapping`` takes each current parameter's
    ``data_ptr`` to its replacement (a sharded parameter). A parameter without one is ``KeyError``: training on
    with the old one would silently not update the model."""
    try:
        for group in optimizer.param_groups:
            group["params"] = [mapping[p.data_ptr] for p in group["params"]]
    except KeyError:
        raise KeyError("a parameter of the optimizer has no replacement in `mapping` (keyed by data_ptr): the "
                       "optimizer would keep updating a parameter the model no longer uses") from None


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel settings object; asynchronous TP is not supported (a warning) and the
    size is ``ParallelismConfig(tp_size=...)``."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            import warnings

            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.", stacklevel=3)


class DeepSpeedEngineWrapper:
    """A DeepSpeed engine driven as a plain loop drives a model: ``backward(loss)`` runs the engine's backward
    and, at the end of an accumulation window (``sync_gradients``), its step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """The engine's backward; its step when ``sync_gradients`` (the engine zeroes the gradients itself)."""
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The engine's last global gradient norm, as a number."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class PrepareForLaunch:
    """``launcher`` made startable as process ``index`` of a forked group: sets ``LOCAL_RANK`` / ``RANK`` (from
    ``NPROC`` and ``NODE_RANK``) for a multi-process ``distributed_type``, or, for a ``debug`` launch, joins a
    gloo group through the file store ``ACCELERATE_DEBUG_RDV_FILE``; then calls ``launcher(*args)``."""

    def __init__(self, launcher: Callable[..., Any], distributed_type: Any = "NO", debug: bool = False) -> None:
        from overdrive.config.enums import DistributedType

        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        if self.debug:
            world_size = int(os.environ["WORLD_SIZE"])
            store = torch.distributed.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            torch.distributed.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type.value.startswith("MULTI_"):
            os.environ["LOCAL_RANK"] = str(index)
            nproc, node_rank = int(os.environ.get("NPROC", 1)), int(os.environ.get("NODE_RANK", 0))
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)
