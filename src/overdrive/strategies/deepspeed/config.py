"""``DeepSpeedPlugin``: DeepSpeed ZeRO with Accelerate's fields, and its DeepSpeed JSON config.

One value can be set in three places: a ``DeepSpeedPlugin`` field, the DeepSpeed JSON, and the
Accelerator's own argument (``mixed_precision``, ``gradient_accumulation_steps``). This module reads the
JSON, builds it from the fields when there is none and checks the two agree, when the plugin is built;
``settle.py`` checks it against the Accelerator when the plan is made and fills the rest ("auto") when an
engine is built. Every disagreement names both values and where they came from.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from overdrive.config.choices import MIXED_PRECISION, invalid_choice
from overdrive.strategies.deepspeed.hf_config import HfDeepSpeedConfig

AUTO = "auto"
_MISSING = object()

#: DeepSpeedPlugin field -> where DeepSpeed reads it in its config
FIELD_PATHS = {
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")

#: Accelerate's ``deepspeed_config`` keys (YAML file / launcher flags) -> DeepSpeedPlugin fields; None: accepted
#: and not needed (torchrun starts the processes of every machine, whatever DeepSpeed launcher is named).
CONFIG_KEYS: dict[str, str | None] = {
    "zero_stage": "zero_stage",
    "offload_optimizer_device": "offload_optimizer_device",
    "offload_param_device": "offload_param_device",
    "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
    "offload_param_nvme_path": "offload_param_nvme_path",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero3_init_flag": "zero3_init_flag",
    "zero3_save_16bit_model": "zero3_save_16bit_model",
    "deepspeed_config_file": "hf_ds_config",
    "deepspeed_moe_layer_cls_names": "transformer_moe_cls_names",
    "deepspeed_multinode_launcher": None,
    "deepspeed_hostfile": None,
    "deepspeed_exclusion_filter": None,
    "deepspeed_inclusion_filter": None,
}

#: DeepSpeed prints a line every ``steps_per_print`` steps (default 10); a plugin without a value stays quiet.
QUIET_STEPS = 2**31 - 1


# -- reading -------------------------------------------------------------------------------------------
def read_config(source: Any) -> tuple[dict[str, Any] | None, str]:
    """The config that ``hf_ds_config`` names (a path to a JSON file, a dict, or an object with a ``config``
    dict) and how messages name it; ``(None, ...)`` when there is none."""
    if source is None:
        return None, "the config built from the plugin's fields"
    if isinstance(source, dict):
        return copy.deepcopy(source), "the DeepSpeed config dict"
    inner = getattr(source, "config", None)
    if isinstance(inner, dict):
        return copy.deepcopy(inner), f"the DeepSpeed config of {type(source).__name__}"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise FileNotFoundError(f"DeepSpeedPlugin(hf_ds_config={str(source)!r}): the file does not exist") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"DeepSpeedPlugin(hf_ds_config={str(source)!r}) is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"DeepSpeedPlugin(hf_ds_config={str(source)!r}) must hold a JSON object, "
                             f"not {type(data).__name__}")
        return data, str(path)
    raise TypeError(f"DeepSpeedPlugin(hf_ds_config=...) takes a path to a JSON file, a dict, or an object with a "
                    f".config dict; got {type(source).__name__}")


def config_from_fields(plugin: Any) -> dict[str, Any]:
    """The config a plugin without ``hf_ds_config`` stands for (Accelerate's defaults: ZeRO stage 2,
    gradient clipping 1.0, no offload); batch sizes, accumulation and precision are "auto"."""
    zero: dict[str, Any] = {
        "stage": 2 if plugin.zero_stage is None else plugin.zero_stage,
        "offload_optimizer": {"device": plugin.offload_optimizer_device or "none"},
        "offload_param": {"device": plugin.offload_param_device or "none"},
        "stage3_gather_16bit_weights_on_model_save": bool(plugin.zero3_save_16bit_model),
    }
    if plugin.offload_optimizer_nvme_path:
        zero["offload_optimizer"]["nvme_path"] = plugin.offload_optimizer_nvme_path
    if plugin.offload_param_nvme_path:
        zero["offload_param"]["nvme_path"] = plugin.offload_param_nvme_path
    return {
        "train_batch_size": AUTO, "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO if plugin.gradient_accumulation_steps is None
        else plugin.gradient_accumulation_steps,
        "gradient_clipping": 1.0 if plugin.gradient_clipping is None else plugin.gradient_clipping,
        "zero_optimization": zero, "bf16": {"enabled": AUTO}, "fp16": {"enabled": AUTO},
        "steps_per_print": QUIET_STEPS,
    }


def get_path(config: dict[str, Any], path: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``, or ``default``."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``"a.b"``, creating the dicts on the way."""
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return str(a).strip().lower() == str(b).strip().lower()
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def apply_fields(plugin: Any, config: dict[str, Any], source: str) -> list[str]:
    """Write the plugin's fields into ``config`` where it has no value or "auto"; return the conflicts."""
    conflicts = []
    for name, path in FIELD_PATHS.items():
        value = getattr(plugin, name)
        if value is None:
            continue
        given = get_path(config, path, _MISSING)
        if given is _MISSING or given == AUTO:
            set_path(config, path, value)
        elif not _same(given, value):
            conflicts.append(f"DeepSpeedPlugin({name}={value!r}) conflicts with {path}={given!r} in {source}; give it "
                             "in one place, or write \"auto\" in the config")
    return conflicts


# -- checking ------------------------------------------------------------------------------------------
def zero_stage_of(config: dict[str, Any]) -> int:
    """The ZeRO stage in ``config`` (0 when absent or not an integer)."""
    stage = get_path(config, "zero_optimization.stage", 0)
    return stage if isinstance(stage, int) and not isinstance(stage, bool) else 0


def _from_text(name: str, value: Any) -> Any:
    """YAML files and flags spell numbers and booleans as text."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if name in ("zero_stage", "gradient_accumulation_steps") and text.lstrip("-").isdigit():
        return int(text)
    if name == "gradient_clipping":
        try:
            return float(text)
        except ValueError:
            return text
    return text


def import_deepspeed() -> Any:
    """The ``deepspeed`` library, or an error that names the package to install."""
    try:
        import deepspeed  # lazy: optional dependency
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
        found = list(self._conflicts)
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            found.append(f"zero_stage={self.zero_stage!r} is not valid; choose 0, 1, 2 or 3")
        stage = zero_stage_of(self.deepspeed_config)
        for kind in ("optimizer", "param"):
            device = get_path(self.deepspeed_config, f"zero_optimization.offload_{kind}.device", "none")
            label = f"offload_{kind}_device={device!r}"
            if str(device).lower() not in OFFLOAD_DEVICES:
                found.append(invalid_choice(label, device, OFFLOAD_DEVICES))
                continue
            if str(device).lower() == "nvme" and not get_path(self.deepspeed_config,
                                                              f"zero_optimization.offload_{kind}.nvme_path"):
                found.append(f"{label} needs offload_{kind}_nvme_path, the folder to offload to")
            if kind == "param" and str(device).lower() != "none" and stage != 3:
                found.append(f"{label} offloads sharded parameters, which only ZeRO stage 3 has (the stage is {stage}); "
                             "use zero_stage=3 or leave offload_param_device out")
            if kind == "optimizer" and str(device).lower() != "none" and stage == 0:
                found.append(f"{label} needs ZeRO stage 1, 2 or 3 (the stage is 0)")
        steps = self.gradient_accumulation_steps
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            found.append(f"gradient_accumulation_steps={steps!r} is not valid; it must be an integer >= 1")
        clip = self.gradient_clipping
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
            found.append(f"gradient_clipping={clip!r} is not valid; give a number >= 0 (0 turns clipping off)")
        if self.enable_msamp:
            found.append("enable_msamp=True: MS-AMP is not supported by overdrive; use mixed_precision='bf16' or 'fp16'")
        return found

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
        from transformers.integrations import (  # lazy: optional dependency
            HfDeepSpeedConfig as TransformersDeepSpeedConfig,
        )
        from transformers.integrations import unset_hf_deepspeed_config  # lazy: optional dependency

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
        own = {f.name for f in fields(cls) if f.init}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in config.items():
            name = CONFIG_KEYS.get(key, key if key in own else "?")
            if name == "?":
                unknown.append(key)
            elif name is not None and value is not None and value != "":
                values[name] = _from_text(name, value)
        if unknown:
            raise ValueError(f"deepspeed_config has unknown keys {sorted(unknown)}; valid keys: {sorted(CONFIG_KEYS)}")
        if str(values.get("offload_optimizer_device", "")).lower() == "none":
            values.pop("offload_optimizer_device")
        if str(values.get("offload_param_device", "")).lower() == "none":
            values.pop("offload_param_device")
        return cls(**values)
