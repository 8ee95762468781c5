"""The config one DeepSpeed engine is built with: the plugin's config with every "auto" filled.

"auto" takes its value from the Accelerator (``mixed_precision``, ``gradient_accumulation_steps``) and the
prepared objects (data loader, optimizer, scheduler, model); a value given nowhere keeps DeepSpeed's
default. The plugin-side helpers (reading the JSON, fields against config) live in
``overdrive.config.deepspeed_json`` and are re-exported here.
"""

from __future__ import annotations

import copy
from typing import Any

from overdrive.config.deepspeed_json import (  # noqa: F401 - the plugin-side helpers, re-exported
    _MISSING,
    AUTO,
    CONFIG_KEYS,
    FIELD_PATHS,
    OFFLOAD_DEVICES,
    QUIET_STEPS,
    apply_fields,
    autos,
    config_from_fields,
    get_path,
    plugin_from_config_dict,
    plugin_problems,
    read_config,
    set_path,
    zero_stage_of,
)


# -- the config one engine is built with ----------------------------------------------------------------
def engine_config(plugin: Any, *, mixed_precision: str, accumulation_steps: int, micro_batch: int | None,
                  world_size: int, optimizer_values: dict[str, Any], scheduler_values: dict[str, Any],
                  hidden_size: int | None, cpu: bool, client_optimizer: bool, training: bool,
                  problems: list[str] | None = None) -> dict[str, Any]:
    """``plugin``'s config with every "auto" filled. Values that cannot be are appended to ``problems``, or
    raised in one error when it is None."""
    raise_here = problems is None
    problems = [] if problems is None else problems
    config = copy.deepcopy(plugin.deepspeed_config)
    source = plugin.config_source
    for name in ("bf16", "fp16"):
        block = config.get(name)
        if isinstance(block, dict) and block.get("enabled") == AUTO:
            block["enabled"] = name == mixed_precision
    if mixed_precision in ("bf16", "fp16"):
        config.setdefault(mixed_precision, {})["enabled"] = True
    if config.get("gradient_accumulation_steps", AUTO) == AUTO:
        config["gradient_accumulation_steps"] = accumulation_steps
    steps = config["gradient_accumulation_steps"]
    if config.get("gradient_clipping") == AUTO:
        config["gradient_clipping"] = 1.0  # DeepSpeed's own default
    problems += _fill_batch(config, micro_batch, steps, world_size, source, training)
    if not training and zero_stage_of(config) in (1, 2):
        config["zero_optimization"]["stage"] = 0  # ZeRO 1 and 2 shard optimizer state: nothing without one
    _fill_bucket_sizes(config, hidden_size)
    for block, values in (("optimizer", optimizer_values), ("scheduler", scheduler_values)):
        params = get_path(config, f"{block}.params")
        if isinstance(params, dict):
            for key, value in params.items():
                found = values.get(key)
                if value == AUTO and found is not None:
                    params[key] = list(found) if isinstance(found, tuple) else found
    config.setdefault("steps_per_print", QUIET_STEPS)
    if client_optimizer:
        # a torch optimizer under ZeRO: DeepSpeed asks for this to be said explicitly
        config.setdefault("zero_allow_untested_optimizer", True)
        if cpu:  # ZeRO-Offload wants DeepSpeed's CPU Adam; on a CPU the torch optimizer already runs there
            config.setdefault("zero_force_ds_cpu_optimizer", False)
    left = list(autos(config))
    if left:
        problems.append(f"these values in {source} are \"auto\" and nothing gives them a value: {', '.join(left)}; "
                        "write the values in the config (optimizer and scheduler values come from a DummyOptim / "
                        "DummyScheduler or the optimizer passed to prepare())")
    if problems and raise_here:
        raise ValueError("cannot build the DeepSpeed engine:\n  - " + "\n  - ".join(problems))
    return config


def _fill_batch(config: dict[str, Any], micro_batch: int | None, steps: int, world_size: int, source: str,
                training: bool) -> list[str]:
    micro = config.get("train_micro_batch_size_per_gpu", AUTO)
    total = config.get("train_batch_size", AUTO)
    per_step = steps * world_size
    if micro == AUTO and isinstance(total, int):
        micro = max(1, total // per_step)
    if micro == AUTO:
        if micro_batch is None and training:
            return [f"train_micro_batch_size_per_gpu is \"auto\" in {source} and prepare() has seen no data loader to "
                    "take it from; pass the training data loader to the same prepare() call as the model, or write "
                    "the value in the config (plugin.deepspeed_config['train_micro_batch_size_per_gpu'] = N)"]
        micro = micro_batch or 1  # an engine without an optimizer only runs forward: the value is bookkeeping
    config["train_micro_batch_size_per_gpu"] = micro
    if total == AUTO:
        config["train_batch_size"] = micro * per_step
    return []


def _fill_bucket_sizes(config: dict[str, Any], hidden_size: int | None) -> None:
    """ZeRO's bucket sizes written "auto" (as Hugging Face's templates do): from the model's hidden size when
    it has one, else DeepSpeed's defaults."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    sizes = {} if hidden_size is None else {
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        if zero.get(key) == AUTO:
            if key in sizes:
                zero[key] = sizes[key]
            else:
                del zero[key]
