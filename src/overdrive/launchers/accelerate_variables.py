"""Accelerate's ``ACCELERATE_*`` (and ``FSDP_*``, ``PARALLELISM_CONFIG_*``) variables, with Accelerate's meaning.

Two directions, both pure functions over plain mappings (the resolver reads ``os.environ`` and the
launcher writes the worker environment; nothing here touches the process environment):

- :func:`settings_from_environment`: the variables a process was started with -> the launch-config keys
  the resolver understands (``mixed_precision``, ``cpu``, ``fsdp_config``...). A bad value raises
  ``ValueError`` naming the variable, the value and the valid choices; unknown ``ACCELERATE_*`` names are
  left alone (Accelerate sets many for its own bookkeeping).
- :func:`variables_for_workers`: a launch config -> the variables Accelerate's launcher would export, so
  that libraries reading them directly (transformers' ``TrainingArguments`` reads
  ``ACCELERATE_MIXED_PRECISION``) agree with ``overdrive launch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from overdrive.launchers.settings import Setting, by_env

#: the switches that choose a strategy: variable -> distributed_type
_STRATEGY_SWITCHES = {"use_fsdp": "FSDP", "use_deepspeed": "DEEPSPEED", "use_megatron_lm": "MEGATRON_LM"}


def settings_from_environment(environ: Mapping[str, str], schema: Sequence[Setting] | None = None
                              ) -> dict[str, Any]:
    """The launch-config settings the ``ACCELERATE_*`` variables in ``environ`` ask for (empty when none
    is set), each checked by its setting's kind. Raises ``ValueError`` listing every bad value, each naming
    its variable."""
    settings: dict[str, Any] = {}
    problems: list[str] = []
    for name, setting in by_env(schema).items():
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        value, problem = setting.check(name, raw)
        if problem:
            problems.append(problem)
            continue
        section, key = setting.place
        (settings.setdefault(section, {}) if section else settings)[key] = value
    if problems:
        raise ValueError("invalid Accelerate environment variables:\n  - " + "\n  - ".join(problems))
    if settings.pop("use_fsdp", False):
        settings["distributed_type"] = "FSDP"
    if settings.pop("use_deepspeed", False):
        if settings.get("distributed_type") == "FSDP":
            raise ValueError("ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED are both set; choose one")
        settings["distributed_type"] = "DEEPSPEED"
    if settings.pop("use_megatron_lm", False):
        if settings.get("distributed_type") in ("FSDP", "DEEPSPEED"):
            raise ValueError(f"ACCELERATE_USE_MEGATRON_LM and ACCELERATE_USE_{settings['distributed_type']} are both "
                             "set; choose one")
        settings["distributed_type"] = "MEGATRON_LM"
    if "use_parallelism_config" in settings and not settings.pop("use_parallelism_config"):
        settings.pop("parallelism_config", None)  # switched off: Accelerate ignores PARALLELISM_CONFIG_*
    if settings.get("mixed_precision") != "fp8":
        settings.pop("fp8_config", None)  # Accelerate reads the fp8 back end only with fp8 mixed precision
    for section, kind in (("fsdp_config", "FSDP"), ("deepspeed_config", "DEEPSPEED")):
        if section in settings and settings.get("distributed_type") != kind:
            del settings[section]  # Accelerate reads these only when the strategy is switched on
    dynamo = settings.get("dynamo_config", {})
    if "dynamo_backend" in dynamo:
        settings["dynamo_backend"] = dynamo["dynamo_backend"].lower()
    return settings


def variables_for_workers(worker_config: Mapping[str, Any], schema: Sequence[Setting] | None = None
                          ) -> dict[str, str]:
    """The ``ACCELERATE_*`` variables Accelerate's launcher would export for ``worker_config``: every setting
    with a variable whose value the launch config holds (the strategy switches from ``distributed_type``)."""
    out: dict[str, str] = {}
    kind = str(worker_config.get("distributed_type") or "").upper()
    switches = {**{name: kind == value for name, value in _STRATEGY_SWITCHES.items()},
                "use_parallelism_config": bool(worker_config.get("parallelism_config"))}
    for name, setting in by_env(schema).items():
        section, key = setting.place
        if setting.name in switches:
            value: Any = True if switches[setting.name] else None
        else:
            value = (worker_config.get(section) or {}).get(key) if section else worker_config.get(key)
        if value is not None:
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    override = (worker_config.get("fp8_config") or {}).get("override_linear_precision")
    if override is not None:  # Accelerate's three variables for the one setting
        for part, value in zip(("FPROP", "DGRAD", "WGRAD"), override):
            out[f"ACCELERATE_FP8_OVERRIDE_{part}"] = str(bool(value))
    # the parallelism settings overdrive's workers do not read, exported as Accelerate's launcher does
    for key, value in (worker_config.get("parallelism_variables") or {}).items():
        out[f"PARALLELISM_CONFIG_{key.upper()}"] = str(value)
    backend = worker_config.get("dynamo_backend")
    if backend:
        out["ACCELERATE_DYNAMO_BACKEND"] = str(backend).upper()
    return out
