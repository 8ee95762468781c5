"""``DeepSpeedPlugin``: DeepSpeed ZeRO with Accelerate's fields (the engine itself is built by the strategy)."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

from overdrive.config.choices import MIXED_PRECISION, invalid_choice
from overdrive.config.deepspeed_json import (
    AUTO,
    apply_fields,
    config_from_fields,
    get_path,
    plugin_from_config_dict,
    plugin_problems,
    read_config,
    set_path,
    zero_stage_of,
)


def import_deepspeed() -> Any:
    """The ``deepspeed`` library, or an error that names the package to install."""
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "DeepSpeed was asked for (DeepSpeedPlugin, --use_deepspeed or distributed_type: DEEPSPEED) but the "
            f"'deepspeed' package cannot be imported ({exc}); install it with: pip install 'overdrive[deepspeed]' "
            "(or pip install deepspeed)") from exc
    return deepspeed


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO with Accelerate's fields; the engine is built by ``prepare()``.

    ``hf_ds_config`` is DeepSpeed's own config (a path to a JSON file or a dict); without it the fields make
    one (ZeRO stage 2, gradient clipping 1.0 as in Accelerate). ``"auto"`` values in the config are filled
    from the fields, the Accelerator (mixed precision, accumulation) and the prepared objects (the data
    loader's batch size, the optimizer's and scheduler's settings). A field and the config that disagree are
    reported together with every other problem when the Accelerator is built::

        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0))
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"), mixed_precision="bf16")

    ``deepspeed_config`` holds the config (editable before ``prepare()``). ``zero3_init_flag`` makes
    ``zero3_init_context_manager()`` build models already sharded (ZeRO-3). See docs/deepspeed.md.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None
    deepspeed_config: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    #: Accelerate's flag, kept for its name: overdrive never sets it (the selection is runtime state of the
    #: Accelerator: ``accelerator.state.select_deepspeed_plugin(name)``, ``accelerator.state.deepspeed_plugin``)
    selected: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        from overdrive.config.hf_deepspeed import HfDeepSpeedConfig

        config, self.config_source = read_config(self.hf_ds_config)
        self.deepspeed_config = config if config is not None else config_from_fields(self)
        if isinstance(getattr(self.hf_ds_config, "config", None), dict):
            # one dict, as in Accelerate: what transformers' HfTrainerDeepSpeedConfig fills in later is seen here
            self.hf_ds_config.config.clear()
            self.hf_ds_config.config.update(self.deepspeed_config)
            self.deepspeed_config = self.hf_ds_config.config
        else:  # Accelerate's shape: hf_ds_config is an HfDeepSpeedConfig over the plugin's config
            self.hf_ds_config = HfDeepSpeedConfig(self.deepspeed_config)
            self.hf_ds_config.config = self.deepspeed_config
        self._conflicts = apply_fields(self, self.deepspeed_config, self.config_source)

    def problems(self) -> list[str]:
        """Every invalid field, and every field the config contradicts (naming both values)."""
        return plugin_problems(self)

    def get_value(self, key: str, default: Any = None) -> Any:
        """The config's value at a dotted ``key`` such as ``"zero_optimization.stage"``."""
        return get_path(self.deepspeed_config, key, default)

    def is_auto(self, key: str) -> bool:
        """Whether the config's value at the dotted ``key`` is still "auto"."""
        return self.get_value(key) == "auto"

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Fill the config's ``fp16.enabled`` / ``bf16.enabled`` (where absent or "auto") for a
        ``mixed_precision`` of "no", "fp16", "bf16" or "fp8" (bf16 compute), as Accelerate does; a config that
        already enables the other half-precision type is refused."""
        if mixed_precision not in MIXED_PRECISION:
            raise ValueError(invalid_choice(f"mixed_precision={mixed_precision!r}", mixed_precision, MIXED_PRECISION))
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(self.get_value(f"{other}.enabled", False)).lower() == "true":
                raise ValueError(f"mixed_precision={mixed_precision!r} contradicts the DeepSpeed config, which "
                                 f"enables {other}: change one of them")
        for dtype, enabled in (("fp16", mixed_precision == "fp16"), ("bf16", mixed_precision in ("bf16", "fp8"))):
            if self.get_value(f"{dtype}.enabled", AUTO) == AUTO:
                set_path(self.deepspeed_config, f"{dtype}.enabled", enabled)

    def set_deepspeed_weakref(self) -> None:
        """Register this config with transformers (its ``HfDeepSpeedConfig``, kept as ``self.dschf``), so that
        ``is_deepspeed_zero3_enabled()`` and ZeRO-3 loading in ``from_pretrained`` see it, as Accelerate does.
        Batch sizes still "auto" count as 1 there."""
        from transformers.integrations import HfDeepSpeedConfig as TransformersDeepSpeedConfig
        from transformers.integrations import unset_hf_deepspeed_config

        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, AUTO) == AUTO:
                config[key] = 1
        if config.get("train_batch_size") == AUTO:
            del config["train_batch_size"]
        unset_hf_deepspeed_config()
        self.dschf = TransformersDeepSpeedConfig(config)

    @property
    def zero_stage_in_use(self) -> int:
        """The ZeRO stage the config asks for (0 when it names none)."""
        return zero_stage_of(self.deepspeed_config)

    def is_zero3_init_enabled(self) -> bool:
        """Whether modules should be built already sharded (``zero3_init_flag`` with ZeRO stage 3)."""
        return bool(self.zero3_init_flag) and self.zero_stage_in_use == 3

    def zero3_init_context_manager(self, enable: bool = False) -> Any:
        """``deepspeed.zero.Init`` for this config when ZeRO-3 init is on (or ``enable``): modules built
        inside are sharded as they are created. A no-op context otherwise."""
        if not (enable or self.is_zero3_init_enabled()):
            return contextlib.nullcontext()
        zero = {k: v for k, v in self.deepspeed_config.get("zero_optimization", {}).items() if v != "auto"}
        dtypes = {k: {"enabled": self.get_value(f"{k}.enabled") is True} for k in ("bf16", "fp16")}
        return import_deepspeed().zero.Init(config_dict_or_path={"zero_optimization": zero, **dtypes,
                                                                 "train_micro_batch_size_per_gpu": 1})

    @classmethod
    def from_config_dict(cls, config: dict[str, Any]) -> DeepSpeedPlugin:
        """The plugin for Accelerate's ``deepspeed_config`` (YAML / launcher) keys, e.g. ``{"zero_stage": 2,
        "offload_optimizer_device": "cpu", "gradient_clipping": 1.0, "deepspeed_config_file": "ds.json"}``."""
        return plugin_from_config_dict(cls, config)
