"""Model-path settings that hold under every strategy: compilation (``TorchDynamoPlugin``, Accelerate's)
and activation checkpointing (``ActivationCheckpointingKwargs``)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

from overdrive.config.choices import invalid_choice
from overdrive.config.enums import BaseEnum


class DynamoBackend(str, BaseEnum):
    """``torch.compile`` backends by Accelerate's upper-case names (``DynamoBackend.INDUCTOR``); ``NO`` turns
    compilation off. The one list of backend names: the plugin, the launch config, ``ACCELERATE_DYNAMO_BACKEND``
    and ``overdrive launch --dynamo_backend`` all check against it."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


#: the backend names in lower case, as ``torch.compile`` and the plugin take them; "no" turns compilation off
DYNAMO_BACKENDS = tuple(member.value.lower() for member in DynamoBackend)
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TorchDynamoPlugin:
    """How ``prepare()`` compiles models with ``torch.compile``, the same under every strategy::

        Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", use_regional_compilation=True))

    - ``backend``: a torch.compile backend ("inductor", "eager", "aot_eager", ...; any case, or Accelerate's
      ``DynamoBackend`` member; "no" or None: no compile, unless ``dynamo_backend=`` or the launch config names one).
    - ``mode``, ``fullgraph``, ``dynamic``, ``options``, ``disable``: passed to ``torch.compile``.
    - ``use_regional_compilation``: compile each repeated block (the transformer layers) instead of the whole
      model; identical blocks share their compiled code, so cold compile time grows with the number of
      distinct block classes only.

    Compilation is in place (``module.compile``): parameter names and checkpoints do not change.
    """

    backend: str | enum.Enum | None = None
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool = False

    @property
    def backend_name(self) -> str:
        """The backend in torch.compile's spelling ("no" when compilation is off)."""
        value = self.backend.value if isinstance(self.backend, enum.Enum) else self.backend
        return "no" if value is None else str(value).lower()

    def problems(self) -> list[str]:
        """Every invalid setting, each naming the value and the valid choices."""
        found = []
        if self.backend_name not in DYNAMO_BACKENDS:
            found.append(invalid_choice(f"TorchDynamoPlugin(backend={self.backend!r})", self.backend, DYNAMO_BACKENDS))
        if self.mode is not None and self.mode not in DYNAMO_MODES:
            found.append(invalid_choice(f"TorchDynamoPlugin(mode={self.mode!r})", self.mode, DYNAMO_MODES))
        if self.options is not None and not isinstance(self.options, dict):
            found.append(f"TorchDynamoPlugin(options={self.options!r}) must be a dict of torch.compile options")
        return found

    def to_dict(self) -> dict[str, Any]:
        """Every field, the backend in torch.compile's spelling (Accelerate's ``to_dict``)."""
        return {"backend": self.backend_name, "mode": self.mode or "default", "fullgraph": self.fullgraph,
                "dynamic": self.dynamic, "options": self.options, "disable": self.disable,
                "use_regional_compilation": self.use_regional_compilation}

    def to_kwargs(self) -> dict[str, Any]:
        """The ``torch.compile`` settings that differ from the defaults (as Accelerate's ``to_kwargs``)."""
        kwargs = {k: v for k, v in self.to_dict().items() if _DYNAMO_DEFAULTS.get(k) != v}
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def __post_init__(self) -> None:
        # as Accelerate: a backend or mode left out is read from what `launch --dynamo_*` exports
        if self.backend is None and "ACCELERATE_DYNAMO_BACKEND" in os.environ:
            self.backend = os.environ["ACCELERATE_DYNAMO_BACKEND"]
        if self.mode is None and "ACCELERATE_DYNAMO_MODE" in os.environ:
            self.mode = os.environ["ACCELERATE_DYNAMO_MODE"]
        # left unset unless `launch --dynamo_use_dynamic` exported it: torch.compile then keeps its own default
        if self.dynamic is None and "ACCELERATE_DYNAMO_USE_DYNAMIC" in os.environ:
            self.dynamic = os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"].strip().lower() in ("1", "true", "yes", "y", "on")


#: TorchDynamoPlugin().to_dict() in an empty environment
_DYNAMO_DEFAULTS: dict[str, Any] = {"backend": "no", "mode": "default", "fullgraph": False, "dynamic": None,
                                    "options": None, "disable": False, "use_regional_compilation": False}


@dataclass
class ActivationCheckpointingKwargs:
    """Recompute each block's activations in backward instead of keeping them, under every strategy
    (single device, DDP, FSDP2, pipeline stages)::

        Accelerator(kwargs_handlers=[ActivationCheckpointingKwargs()])

    ``block_names``: class names of the blocks to checkpoint (default: the FSDP plugin's
    ``transformer_cls_names_to_wrap``, the model's ``_no_split_modules``, else its repeated blocks).
    ``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` means the same.
    """

    enabled: bool = True
    block_names: list[str] | None = None
