"""``FullyShardedDataParallelPlugin``: Accelerate's FSDP fields, carried out by FSDP2 (``fully_shard``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from overdrive.config.choices import invalid_choice

#: Accelerate's ``fsdp_config`` keys (YAML / launcher) -> FullyShardedDataParallelPlugin fields.
FSDP_CONFIG_KEYS = {
    "fsdp_version": "fsdp_version",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "fsdp_min_num_params": "min_num_params",
    "fsdp_reshard_after_forward": "reshard_after_forward",
    "fsdp_sharding_strategy": "sharding_strategy",
    "fsdp_offload_params": "cpu_offload",
    "fsdp_state_dict_type": "state_dict_type",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_activation_checkpointing": "activation_checkpointing",
    "fsdp_backward_prefetch": "backward_prefetch",
    "fsdp_backward_prefetch_policy": "backward_prefetch",
    "fsdp_forward_prefetch": "forward_prefetch",
    "fsdp_sync_module_states": "sync_module_states",
    "fsdp_use_orig_params": "use_orig_params",
    "fsdp_limit_all_gathers": "limit_all_gathers",
    "fsdp_ignored_modules": "ignored_modules",
}
_WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
# FSDP1 sharding strategies -> FSDP2 reshard_after_forward (HYBRID_* also need dp_replicate_size > 1).
_SHARDING_STRATEGIES = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True,
                        "_HYBRID_SHARD_ZERO2": False, "HYBRID_SHARD_ZERO2": False}


@dataclass
class FullyShardedDataParallelPlugin:
    """Fully sharded data parallel with Accelerate's fields, carried out by FSDP2 (``fully_shard``).

    - ``reshard_after_forward``: free the gathered parameters after forward (``True``, as FULL_SHARD) or
      keep them for backward (``False``, as SHARD_GRAD_OP). ``sharding_strategy`` (FSDP1's name) maps here.
    - ``auto_wrap_policy``: which submodules get their own ``fully_shard`` group: ``"transformer_based_wrap"``
      (classes named in ``transformer_cls_names_to_wrap``; default: the model's ``_no_split_modules`` or its
      repeated blocks), ``"size_based_wrap"`` (``min_num_params``), ``"no_wrap"``, or a callable
      ``policy(name, module) -> bool``.
    - ``cpu_offload``: keep sharded parameters, gradients and optimizer state on the CPU.
    - ``mixed_precision_policy``: overrides the policy taken from ``Accelerator(mixed_precision=...)``
      (a ``MixedPrecisionPolicy``, a dict of its fields, or a dtype name such as ``"bf16"``).
    - ``activation_checkpointing``: recompute each wrapped block's activations in backward.
    - ``cpu_ram_efficient_loading``: only rank 0 holds the full weights (others may build the model on
      the meta device); the model is sharded on the meta device and the weights are broadcast from rank 0.
    - ``state_dict_type``: ``"SHARDED_STATE_DICT"`` (each process saves its shards) or ``"FULL_STATE_DICT"``.
    - ``ignored_modules``: modules (or a regex on their names) that FSDP leaves alone.

    ``fsdp_version=1`` is accepted and runs on FSDP2. ``backward_prefetch``, ``forward_prefetch``,
    ``limit_all_gathers`` and ``use_orig_params`` are FSDP1 settings, accepted and not needed by FSDP2.

        FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                       transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    """

    fsdp_version: int | None = None
    reshard_after_forward: bool | int | str | None = None
    sharding_strategy: str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable | str | None = None
    cpu_offload: Any = False
    ignored_modules: Any = None
    state_dict_type: str = "SHARDED_STATE_DICT"
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable | None = None
    sync_module_states: bool = True
    forward_prefetch: bool = False
    activation_checkpointing: bool = False
    cpu_ram_efficient_loading: bool = False
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid FullyShardedDataParallelPlugin:\n  - " + "\n  - ".join(problems))
        if self.fsdp_version is not None:
            self.fsdp_version = int(self.fsdp_version)
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [
                name.strip() for name in self.transformer_cls_names_to_wrap.split(",") if name.strip()]
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = self.auto_wrap_policy.lower()
        self.state_dict_type = _state_dict_name(self.state_dict_type)
        if self.min_num_params is not None:
            self.min_num_params = int(self.min_num_params)
        if self.min_num_params and self.auto_wrap_policy is None:
            self.auto_wrap_policy = "size_based_wrap"

    def problems(self) -> list[str]:
        """Every invalid field, each naming the value and the valid choices."""
        found = []
        if self.fsdp_version not in (None, 1, 2, "1", "2"):
            found.append(f"fsdp_version={self.fsdp_version!r} is not valid; choose 1 or 2 (both run on FSDP2)")
        if self.sharding_strategy is not None and _sharding_name(self.sharding_strategy) not in _SHARDING_STRATEGIES:
            found.append(invalid_choice(f"sharding_strategy={self.sharding_strategy!r}", self.sharding_strategy,
                                        sorted(_SHARDING_STRATEGIES)) + " (NO_SHARD is plain DDP: leave fsdp_plugin out)")
        rsf = self.reshard_after_forward
        if isinstance(rsf, str) and _sharding_name(rsf) not in _SHARDING_STRATEGIES and rsf.lower() not in (
                "true", "false"):
            found.append(f"reshard_after_forward={rsf!r} is not valid; give True, False or an int")
        policy = self.auto_wrap_policy
        if isinstance(policy, str) and policy.lower() not in _WRAP_POLICIES:
            found.append(invalid_choice(f"auto_wrap_policy={policy!r}", policy, _WRAP_POLICIES)
                         + "; or give a callable policy(name, module) -> bool")
        elif policy is not None and not isinstance(policy, str) and not callable(policy):
            found.append(f"auto_wrap_policy={policy!r} is neither a policy name nor a callable")
        if _state_dict_name(self.state_dict_type) not in _STATE_DICT_TYPES:
            found.append(invalid_choice(f"state_dict_type={self.state_dict_type!r}", self.state_dict_type,
                                        _STATE_DICT_TYPES))
        if self.min_num_params is not None and (not str(self.min_num_params).isdigit()):
            found.append(f"min_num_params={self.min_num_params!r} must be a non-negative integer")
        return found

    def set_auto_wrap_policy(self, model: Any) -> None:
        """Turn a policy name into torch's FSDP1-style policy for ``model``, as Accelerate does (for libraries
        that wrap a model themselves from this plugin): ``"transformer_based_wrap"`` wraps the classes named
        in ``transformer_cls_names_to_wrap`` (default: the model's ``_no_split_modules``),
        ``"size_based_wrap"`` modules of ``min_num_params`` or more; ``"no_wrap"`` wraps nothing. overdrive's
        own ``prepare`` takes either form."""
        # lazy: config/ loads no torch, so `import overdrive` does not
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy == "transformer_based_wrap":
            names = self.transformer_cls_names_to_wrap or list(getattr(model, "_no_split_modules", None) or [])
            self.transformer_cls_names_to_wrap = list(names)
            by_name = {type(m).__name__: type(m) for m in model.modules()}
            missing = [n for n in names if n not in by_name]
            if missing:
                raise ValueError(f"transformer_cls_names_to_wrap names {missing}, which {type(model).__name__} does "
                                 f"not contain; its module classes are {sorted(by_name)[:20]}")
            self.auto_wrap_policy = functools.partial(transformer_auto_wrap_policy,
                                                      transformer_layer_cls={by_name[n] for n in names})
        elif self.auto_wrap_policy == "size_based_wrap" and self.min_num_params:
            self.auto_wrap_policy = functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params)
        elif self.auto_wrap_policy in ("size_based_wrap", "no_wrap"):
            self.auto_wrap_policy = _wrap_nothing

    def set_mixed_precision(self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False) -> None:
        """Set ``mixed_precision_policy`` to FSDP2's ``MixedPrecisionPolicy`` for a dtype or its name ("bf16",
        "fp16", "fp32", "fp8" = bf16), unless a policy is set already (``override=True`` replaces it).
        ``buffer_autocast`` is FSDP1's buffer setting, accepted (FSDP2 keeps buffers as they are)."""
        import torch  # lazy: config/ loads no torch, so `import overdrive` does not
        from torch.distributed.fsdp import MixedPrecisionPolicy  # lazy: as torch above

        names = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        dtype = names.get(mixed_precision) if isinstance(mixed_precision, str) else mixed_precision
        if dtype not in names.values():
            raise ValueError(invalid_choice(f"mixed_precision={mixed_precision!r}", mixed_precision,
                                            [*names, *sorted({str(d) for d in names.values()})]))
        if override or self.mixed_precision_policy is None:
            self.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)

    @property
    def reshard(self) -> bool | int:
        """``reshard_after_forward`` as FSDP2 takes it (True unless asked otherwise)."""
        value = self.reshard_after_forward
        if value is None:
            return _SHARDING_STRATEGIES.get(_sharding_name(self.sharding_strategy or "FULL_SHARD"), True)
        if isinstance(value, str):
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
            return _SHARDING_STRATEGIES[_sharding_name(value)]
        return value

    @property
    def wants_hybrid_shard(self) -> bool:
        """Whether the FSDP1 strategy named asks for HSDP (replicate x shard)."""
        names = (self.sharding_strategy, self.reshard_after_forward)
        return any(isinstance(n, str) and _sharding_name(n).lstrip("_").startswith("HYBRID") for n in names)

    @classmethod
    def from_config_dict(cls, config: dict[str, Any]) -> FullyShardedDataParallelPlugin:
        """The plugin for Accelerate's ``fsdp_config`` (YAML / launcher) keys, e.g.
        ``{"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "fsdp_offload_params": False}``.
        The plugin's own field names are accepted too."""
        own = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in config.items():
            name = FSDP_CONFIG_KEYS.get(key, key if key in own else None)
            if name is None:
                unknown.append(key)
            else:
                values[name] = _from_yaml(value)
        if unknown:
            raise ValueError(f"fsdp_config has unknown keys {sorted(unknown)}; valid keys: "
                             f"{sorted(FSDP_CONFIG_KEYS)}")
        return cls(**values)



def _wrap_nothing(module: Any, recurse: bool, nonwrapped_numel: int) -> bool:
    """An FSDP1-style policy that wraps no submodule (the root is wrapped anyway)."""
    return False


def _from_yaml(value: Any) -> Any:
    """YAML and environment spell booleans and numbers as strings: read them back."""
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low.isdigit():
            return int(low)
    return value


def _sharding_name(value: Any) -> str:
    text = str(getattr(value, "name", value)).upper()
    return {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "4": "HYBRID_SHARD", "5": "_HYBRID_SHARD_ZERO2"}.get(text, text)


def _state_dict_name(value: Any) -> str:
    text = str(getattr(value, "name", value)).upper()
    return {"SHARDED": "SHARDED_STATE_DICT", "FULL": "FULL_STATE_DICT", "1": "FULL_STATE_DICT",
            "3": "SHARDED_STATE_DICT"}.get(text, text)
