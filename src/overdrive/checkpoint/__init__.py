"""Checkpoints: the whole training state with ``torch.distributed.checkpoint``, and full weights as
safetensors.

    accelerator.save_state("ckpt")        # sharded, every rank writes its part, atomic, checksummed
    accelerator.load_state("ckpt")        # at the same or another world size
    accelerator.save_model(model, "out")  # model.safetensors (+ shards and index when large)

``overdrive merge-weights CKPT OUT`` turns the model of a checkpoint into the ``save_model`` layout.
See docs/checkpoints.md for the format, the safety of loading and what resumes exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.export import get_state_dict, merge_weights, merge_weights_main, save_model
from overdrive.checkpoint.load import load_state
from overdrive.checkpoint.naming import complete_checkpoints, newest_checkpoint
from overdrive.checkpoint.save import save_state
from overdrive.checkpoint.state import ModelState, OptimizerState

__all__ = [
    "CheckpointError",
    "ModelState",
    "OptimizerState",
    "check_stateful",
    "complete_checkpoints",
    "get_state_dict",
    "load_state",
    "merge_weights",
    "merge_weights_main",
    "newest_checkpoint",
    "save_model",
    "save_state",
]


def check_stateful(objects: Iterable[Any]) -> list[Any]:
    """``objects`` as a list, if each has ``state_dict()`` and ``load_state_dict()``; otherwise an error
    that names every one that lacks them."""
    objects = list(objects)
    bad = [f"Item at index {i}: {type(obj).__name__} ({obj!r:.60})" for i, obj in enumerate(objects)
           if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
    if bad:
        raise ValueError("register_for_checkpointing() needs objects with state_dict() and load_state_dict() "
                         f"methods; these lack them: {'; '.join(bad)}")
    return objects
