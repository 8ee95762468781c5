"""The model path's settings: plain values the resolver builds and the transforms read (no transform
code here, so both sides import this module and not each other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overdrive.precision.policy import PrecisionPolicy

if TYPE_CHECKING:
    from overdrive.config import AORecipeKwargs, FullyShardedDataParallelPlugin, TERecipeKwargs


@dataclass(frozen=True, slots=True)
class CompileSettings:
    """``torch.compile`` options (from ``TorchDynamoPlugin`` or ``dynamo_backend``), resolved.
    ``regional``: compile each repeated block (once per distinct block class) instead of the whole model."""

    backend: str = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    regional: bool = False

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile`` / ``Module.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic,
                                  "disable": self.disable}
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs


@dataclass(frozen=True, slots=True, eq=False)
class ModelTransforms:
    """What to do to every prepared model, independent of the model and of the strategy. ``block_names``: class
    names of the blocks to checkpoint and compile (default: FSDP's wrap names, else the repeated blocks);
    ``fp8``: the fp8 recipe: ``precision.fp8.apply_fp8`` converts the linear layers right after placement, so
    tensor parallel, compile and data parallel see float8 modules."""

    tp_plan: dict[str, str] | None = None
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    block_names: tuple[str, ...] = ()
    compile: CompileSettings | None = None
    #: the FSDP plugin given or launched (None: none, so its defaults: FSDP reads it, the others its wrap names)
    fsdp: FullyShardedDataParallelPlugin | None = None
    precision: PrecisionPolicy = field(default_factory=PrecisionPolicy)
    fp8: AORecipeKwargs | TERecipeKwargs | None = None
