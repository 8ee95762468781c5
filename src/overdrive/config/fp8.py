"""The fp8 recipes of ``mixed_precision="fp8"``: torchao float8 training and NVIDIA Transformer Engine, with
Accelerate's names and fields. ``overdrive.precision.fp8`` resolves and applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from overdrive.config.choices import invalid_choice
from overdrive.config.kwargs import KwargsHandler

#: torchao's float8 training recipes by name (``Float8LinearConfig.from_recipe_name``)
AO_RECIPE_NAMES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
TE_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
TE_AMAX_ALGORITHMS = ("max", "most_recent")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 training with torchao (``mixed_precision="fp8"``): ``nn.Linear`` layers become torchao's
    ``Float8Linear``; everything else runs in bf16 autocast::

        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(config="rowwise")])

    - ``config``: a ``torchao.float8.Float8LinearConfig``, or a recipe name ("tensorwise", "rowwise",
      "rowwise_with_gw_hp"); None: tensorwise scaling with ``pad_inner_dim`` and, when parameters are
      sharded by FSDP2, ``enable_fsdp_float8_all_gather``.
    - ``module_filter_func(module, fqn) -> bool``: which linear layers to convert; by default every one
      except the model's first and last ``nn.Linear`` and those with a dimension not divisible by 16.
    - ``pad_inner_dim`` / ``enable_fsdp_float8_all_gather``: the defaults above, when ``config`` is not an
      object (a ``Float8LinearConfig`` holds its own).
    """

    config: Any = None
    module_filter_func: Callable[[Any, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    backend = "AO"


@dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 training with NVIDIA Transformer Engine (``mixed_precision="fp8"``, CUDA only): ``nn.Linear``
    and ``nn.LayerNorm`` become Transformer Engine's modules (sharing the parameters) and each prepared
    model's forward runs in ``te.fp8_autocast`` with this recipe (``DelayedScaling``, or
    ``MXFP8BlockScaling`` with ``use_mxfp8_block_scaling``)::

        Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(fp8_format="HYBRID")])
    """

    use_autocast_during_eval: bool = False
    margin: int = 0
    interval: int = 1
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "most_recent"
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    use_mxfp8_block_scaling: bool = False

    backend = "TE"

    def __post_init__(self) -> None:
        self.fp8_format = str(self.fp8_format).upper()
        self.amax_compute_algo = str(self.amax_compute_algo).lower()
        if self.fp8_format not in TE_FP8_FORMATS:
            raise ValueError(invalid_choice(f"fp8_format={self.fp8_format!r}", self.fp8_format, TE_FP8_FORMATS))
        if self.amax_compute_algo not in TE_AMAX_ALGORITHMS:
            raise ValueError(invalid_choice(f"amax_compute_algo={self.amax_compute_algo!r}", self.amax_compute_algo,
                                            TE_AMAX_ALGORITHMS))
        # three flags (fprop, dgrad, wgrad), as given
        self.override_linear_precision = cast("tuple[bool, bool, bool]",
                                              tuple(bool(v) for v in self.override_linear_precision))
