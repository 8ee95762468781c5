"""Accelerate's ``accelerate.inference`` names, from :mod:`overdrive.big_model.pippy` (re-exports only)."""

from overdrive.big_model.pippy import find_pippy_batch_size, generate_device_map, prepare_pippy

# both are made from the REFUSALS table at import (globals().update), which pyright cannot follow
from overdrive.compat.refusals import build_pipeline, pippy_forward  # pyright: ignore[reportAttributeAccessIssue]

__all__ = ["prepare_pippy", "find_pippy_batch_size", "generate_device_map", "build_pipeline", "pippy_forward"]
