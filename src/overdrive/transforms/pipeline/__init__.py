"""Pipeline parallelism as a model transform: cut the model into stages (``split``), place and sum tied
weights across stages (``ties``), pick and check a schedule (``schedule``), and run the stages behind one
module (``model``: ``apply_pipeline``, ``PipelinedModel``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from overdrive._lazy import lazy_exports

_EXPORTS = {
    "PipelinedModel": "overdrive.transforms.pipeline.model",
    "apply_pipeline": "overdrive.transforms.pipeline.model",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from overdrive.transforms.pipeline.model import PipelinedModel, apply_pipeline
