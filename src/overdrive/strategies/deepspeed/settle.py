"""DeepSpeed's config settled against the rest of the run, every problem reported at once.

When the plan is made, ``resolve_deepspeed`` (the DeepSpeed strategy's step, which the resolver is handed:
it sits below the strategies) checks each plugin against the Accelerator's own arguments
(``mixed_precision``, ``gradient_accumulation_steps``) and settles the run's precision and accumulation.
When an engine is built, ``engine_config`` fills every "auto" left from the Accelerator and the prepared
objects (data loader, optimizer, scheduler, model); a value given nowhere keeps DeepSpeed's default. The
plugin itself and its JSON are ``config.py``.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from overdrive.strategies.deepspeed.config import AUTO, QUIET_STEPS, DeepSpeedPlugin, get_path, zero_stage_of


# -- the plan: each plugin against the Accelerator's arguments -------------------------------------------
class ReadOnlyPlugins(Mapping[str, Any]):
    """The plan's plugins by name: readable as a dict, not writable, and picklable (transformers' Trainer
    saves its TrainingArguments, which hold the state and so this plan; a ``mappingproxy`` cannot be)."""

    def __init__(self, plugins: Mapping[str, Any]) -> None:
        self._plugins = dict(plugins)

    def __getitem__(self, name: str) -> Any:
        return self._plugins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)

    def __repr__(self) -> str:
        return f"ReadOnlyPlugins({self._plugins!r})"


@dataclass(frozen=True)
class DeepSpeedSettings:
    """What the resolver decided for a DeepSpeed run: the plugins by name (copies of those given, read-only;
    which one builds the next engine is runtime state: ``AcceleratorState.select_deepspeed_plugin``), and the
    run's mixed precision and accumulation steps that fill their "auto" values."""

    plugins: Mapping[str, Any]
    mixed_precision: str = "no"
    accumulation_steps: int = 1
    split_batches: bool = False
    #: this process's index on its machine (DeepSpeed reads it from LOCAL_RANK, which SLURM or MPI may not set)
    local_rank: int = 0


def resolve_deepspeed(plugin: Any, plugins: Any, launched: dict[str, Any], *, mixed_precision: str | None,
                      explicit_steps: int | None, split_batches: bool, others: dict[str, Any],
                      errors: list[str], local_rank: int = 0) -> DeepSpeedSettings | None:
    """The DeepSpeed settings of a run (None without DeepSpeed): the plugins given to the Accelerator, or the
    launch config's ``deepspeed_config`` when it says ``distributed_type: DEEPSPEED``. ``others`` names the
    other parallelism settings given (``{"fsdp_plugin": ...}``), which cannot be combined with DeepSpeed.
    Problems are appended to ``errors``."""
    if plugin is not None and plugins is not None:
        errors.append("deepspeed_plugin and deepspeed_plugins were both given; give one (they are two names for the "
                      "same argument)")
    given = plugins if plugins is not None else plugin
    if given is None and str(launched.get("distributed_type", "")).upper() == "DEEPSPEED":
        try:
            given = DeepSpeedPlugin.from_config_dict(launched.get("deepspeed_config") or {})
        except (ValueError, TypeError, FileNotFoundError) as exc:
            errors.append(f"the launch config's deepspeed_config: {exc}")
            return None
    if given is None:
        return None
    named = {"default": given} if isinstance(given, DeepSpeedPlugin) else given
    if not isinstance(named, dict) or not named or not all(isinstance(p, DeepSpeedPlugin) for p in named.values()):
        errors.append(f"deepspeed_plugin(s)={given!r} is neither a DeepSpeedPlugin nor a non-empty dict of name -> "
                      "DeepSpeedPlugin")
        return None
    for name, value in others.items():
        if value is not None:
            errors.append(f"DeepSpeed (deepspeed_plugin) and {name} were both given; DeepSpeed shards over all "
                          f"processes itself: give one of them")
    if not _importable("deepspeed"):
        errors.append("DeepSpeed was asked for but the 'deepspeed' package cannot be imported; install it with: "
                      "pip install 'overdrive[deepspeed]' (or pip install deepspeed)")
    # the plan's own copies: settling and "auto" filling edit the config, the user's plugins stay as given
    named = {name: copy.deepcopy(each) for name, each in named.items()}
    precision, steps = settle(named, mixed_precision, explicit_steps, errors)
    return DeepSpeedSettings(plugins=ReadOnlyPlugins(named), mixed_precision=precision, accumulation_steps=steps,
                             split_batches=split_batches, local_rank=local_rank)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def settle(plugins: dict[str, Any], mixed_precision: str | None, accumulation: int | None,
           errors: list[str]) -> tuple[str, int]:
    """Check every plugin against the Accelerator's explicit values (``None``: not given) and return the
    run's mixed precision and accumulation steps (the first plugin's, when the Accelerator gave none)."""
    asked = None if mixed_precision in (None, "no") else str(mixed_precision).lower()
    settled: tuple[str, int] | None = None
    for name, plugin in plugins.items():
        prefix = f"deepspeed_plugins[{name!r}]: " if len(plugins) > 1 else ""
        config, source = plugin.deepspeed_config, plugin.config_source
        problems = plugin.problems()
        precision, found = _precision_problems(config, asked, source)
        problems += found
        steps = config.get("gradient_accumulation_steps", AUTO)
        if steps == AUTO:
            steps = accumulation or 1
        elif not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            problems.append(f"gradient_accumulation_steps={steps!r} in {source} is not valid; it must be an integer >= 1")
            steps = 1
        elif accumulation is not None and steps != accumulation:
            problems.append(f"gradient_accumulation_steps={accumulation} (Accelerator) conflicts with "
                            f"gradient_accumulation_steps={steps} in {source}; give it in one place, or write \"auto\"")
        errors.extend(prefix + problem for problem in problems)
        if settled is None:
            settled = (precision or asked or "no", steps)
    assert settled is not None
    return settled


def _precision_problems(config: dict[str, Any], asked: str | None, source: str) -> tuple[str | None, list[str]]:
    """The precision the config turns on (None: it leaves it to the Accelerator), and its conflicts."""
    found = []
    if "bfloat16" in config and "bf16" not in config:  # DeepSpeed's other name for the bf16 block
        config["bf16"] = config.pop("bfloat16")
    turned_on = [name for name in ("bf16", "fp16") if get_path(config, f"{name}.enabled") is True]
    if len(turned_on) > 1:
        found.append(f"{source} turns on both bf16 and fp16; turn on one")
    if asked == "fp8":
        found.append("mixed_precision='fp8' cannot run with DeepSpeed in overdrive; use 'bf16' or 'fp16'")
    elif asked and turned_on and turned_on[0] != asked:
        found.append(f"mixed_precision={asked!r} (Accelerator) conflicts with {turned_on[0]}.enabled=true in "
                     f"{source}; give the precision in one place, or write \"enabled\": \"auto\"")
    elif asked and get_path(config, f"{asked}.enabled") is False:
        found.append(f"mixed_precision={asked!r} (Accelerator) conflicts with {asked}.enabled=false in {source}")
    return (turned_on[0] if turned_on else None), found


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


def autos(node: Any, prefix: str = "") -> Iterator[str]:
    """The paths of every value still ``"auto"``."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from autos(value, f"{prefix}{key}.")
    elif node == AUTO:
        yield prefix.rstrip(".")
