"""Accelerate's ``accelerate.inference`` names, from :mod:`overdrive.big_model.pippy` (re-exports only)."""

from overdrive.big_model.pippy import prepare_pippy

__all__ = ["prepare_pippy"]
