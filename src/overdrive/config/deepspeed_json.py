"""A DeepSpeed plugin's config dict: read it, build it from the plugin's fields, check the two agree.

One value can be set in three places: a ``DeepSpeedPlugin`` field, the DeepSpeed JSON, and the
Accelerator's own argument (``mixed_precision``, ``gradient_accumulation_steps``). This module handles the
first two, when the plugin is built; the strategy fills the rest ("auto") when an engine is built
(``overdrive.strategies.deepspeed.ds_config.engine_config``). Every disagreement names both values and where they came from.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from overdrive.config.choices import invalid_choice

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


def autos(node: Any, prefix: str = "") -> Iterator[str]:
    """The paths of every value still ``"auto"``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from autos(value, f"{prefix}{key}.")
    elif node == AUTO:
        yield prefix.rstrip(".")


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


def plugin_problems(plugin: Any) -> list[str]:
    """Every invalid field of ``plugin``, and every field its config contradicts."""
    found = list(plugin._conflicts)
    if plugin.zero_stage is not None and plugin.zero_stage not in (0, 1, 2, 3):
        found.append(f"zero_stage={plugin.zero_stage!r} is not valid; choose 0, 1, 2 or 3")
    stage = zero_stage_of(plugin.deepspeed_config)
    for kind in ("optimizer", "param"):
        device = get_path(plugin.deepspeed_config, f"zero_optimization.offload_{kind}.device", "none")
        label = f"offload_{kind}_device={device!r}"
        if str(device).lower() not in OFFLOAD_DEVICES:
            found.append(invalid_choice(label, device, OFFLOAD_DEVICES))
            continue
        if str(device).lower() == "nvme" and not get_path(plugin.deepspeed_config,
                                                          f"zero_optimization.offload_{kind}.nvme_path"):
            found.append(f"{label} needs offload_{kind}_nvme_path, the folder to offload to")
        if kind == "param" and str(device).lower() != "none" and stage != 3:
            found.append(f"{label} offloads sharded parameters, which only ZeRO stage 3 has (the stage is {stage}); "
                         "use zero_stage=3 or leave offload_param_device out")
        if kind == "optimizer" and str(device).lower() != "none" and stage == 0:
            found.append(f"{label} needs ZeRO stage 1, 2 or 3 (the stage is 0)")
    steps = plugin.gradient_accumulation_steps
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        found.append(f"gradient_accumulation_steps={steps!r} is not valid; it must be an integer >= 1")
    clip = plugin.gradient_clipping
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        found.append(f"gradient_clipping={clip!r} is not valid; give a number >= 0 (0 turns clipping off)")
    if plugin.enable_msamp:
        found.append("enable_msamp=True: MS-AMP is not supported by overdrive; use mixed_precision='bf16' or 'fp16'")
    return found


def plugin_from_config_dict(cls: type, config: dict[str, Any]) -> Any:
    """A DeepSpeedPlugin for Accelerate's ``deepspeed_config`` keys (YAML / launcher), or the plugin's own
    field names."""
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
