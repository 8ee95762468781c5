"""Data parallel as a model transform: FSDP2 ``fully_shard`` groups chosen by a wrap policy, and the
FSDP2 forms of precision (``MixedPrecisionPolicy``) and offload (``CPUOffloadPolicy``)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.config.choices import invalid_choice
from overdrive.precision import PrecisionPolicy
from overdrive.runtime import group
from overdrive.transforms.settings import ModelTransforms

#: policy(name, module, numel of its parameters not yet in a group) -> give it its own fully_shard group
WrapPolicy = Callable[[str, nn.Module, int], bool]
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16, "no": None, "none": None}


@dataclass
class FullyShardSettings:
    """What ``apply_fully_shard`` needs, already translated from the plugin and the precision policy."""

    reshard_after_forward: bool | int = True
    mp_policy: Any = None
    root_mp_policy: Any = None
    offload_policy: Any = None
    wrap: WrapPolicy = field(default=lambda name, module, numel: False)
    ignored_params: set[nn.Parameter] = field(default_factory=set)


def mixed_precision_policy(plugin: FullyShardedDataParallelPlugin, precision: PrecisionPolicy,
                           root: bool = False) -> Any:
    """FSDP2's ``MixedPrecisionPolicy``: the plugin's if it gives one, else from ``mixed_precision``.

    Parameters are gathered in the compute dtype and gradients reduced in the policy's reduce dtype
    (fp32): one policy replaces autocast. The root module returns fp32 outputs, as autocast would.
    """
    given = plugin.mixed_precision_policy
    if isinstance(given, MixedPrecisionPolicy):
        return given
    if isinstance(given, str):
        given = {"param_dtype": given, "reduce_dtype": "fp32"}
    if isinstance(given, dict):
        fields: dict[str, Any] = {k: _dtype(v) if k.endswith("dtype") else v for k, v in given.items()}
        return MixedPrecisionPolicy(**fields)
    if given is not None:
        raise ValueError(f"mixed_precision_policy={given!r} is not valid; give a MixedPrecisionPolicy, a dict of "
                         "its fields or a dtype name ('bf16', 'fp16', 'fp32')")
    if not precision.enabled:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=precision.compute_dtype, reduce_dtype=precision.reduce_dtype,
                                output_dtype=torch.float32 if root else None)


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    key = str(value).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(invalid_choice(f"dtype {value!r}", value, sorted(k for k in _DTYPES if k != "none")))
    return _DTYPES[key]


def offload_policy(plugin: FullyShardedDataParallelPlugin) -> Any:
    """``CPUOffloadPolicy`` when ``cpu_offload`` asks for it (pinned memory only with an accelerator)."""
    value = plugin.cpu_offload
    if isinstance(value, OffloadPolicy):
        return value
    if getattr(value, "offload_params", value):  # FSDP1's CPUOffload(offload_params=True) or a bool
        return CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
    return OffloadPolicy()


def wrap_policy(plugin: FullyShardedDataParallelPlugin, model: nn.Module, blocks: list[nn.Module]) -> WrapPolicy:
    """Which submodules get their own ``fully_shard`` group (the root always gets one)."""
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return _user_policy(policy)
    if policy == "no_wrap":
        return lambda name, module, numel: False
    if policy == "size_based_wrap":
        threshold = plugin.min_num_params if plugin.min_num_params is not None else 100_000_000
        return lambda name, module, numel: numel >= threshold
    names = plugin.transformer_cls_names_to_wrap or list(getattr(model, "_no_split_modules", None) or [])
    if names:
        present = {type(m).__name__ for m in model.modules()}
        if not set(names) & present:
            raise ValueError(f"transformer_cls_names_to_wrap={sorted(names)} names no class of "
                             f"{type(model).__name__}; its module classes are {sorted(present)[:20]}")
        wanted = set(names)
        return lambda name, module, numel: type(module).__name__ in wanted
    chosen = {id(b) for b in blocks}
    return lambda name, module, numel: id(module) in chosen


def _user_policy(policy: Callable) -> WrapPolicy:
    try:
        takes_recurse = "recurse" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        takes_recurse = False
    if takes_recurse:  # FSDP1's policy(module, recurse, nonwrapped_numel)
        return lambda name, module, numel: bool(policy(module=module, recurse=False, nonwrapped_numel=numel))
    return lambda name, module, numel: bool(policy(name, module))


def ignored_parameters(plugin: FullyShardedDataParallelPlugin, model: nn.Module) -> set[nn.Parameter]:
    """Parameters of ``ignored_modules`` (modules, or a regex on module names)."""
    ignored = plugin.ignored_modules
    if not ignored:
        return set()
    if isinstance(ignored, str):
        regex = re.compile(ignored)
        modules = [m for n, m in model.named_modules() if n and regex.search(n)]
        if not modules:
            raise ValueError(f"ignored_modules={ignored!r} matches no module name of {type(model).__name__}")
    else:
        modules = list(ignored)
    return {p for m in modules for p in m.parameters()}


def fully_shard_settings(model: nn.Module, transforms: ModelTransforms, blocks: list[nn.Module]) -> FullyShardSettings:
    """The plan's FSDP plugin and precision translated for ``model`` (whose ``blocks`` the wrap policy may pick)."""
    fsdp, precision = transforms.fsdp or FullyShardedDataParallelPlugin(), transforms.precision
    return FullyShardSettings(
        reshard_after_forward=fsdp.reshard, mp_policy=mixed_precision_policy(fsdp, precision),
        root_mp_policy=mixed_precision_policy(fsdp, precision, root=True), offload_policy=offload_policy(fsdp),
        wrap=wrap_policy(fsdp, model, blocks), ignored_params=ignored_parameters(fsdp, model))


def apply_fully_shard(model: nn.Module, mesh: Any, settings: FullyShardSettings) -> None:
    """``fully_shard`` the modules the wrap policy picks (children before parents), then the root."""
    claimed = set(settings.ignored_params)
    common = dict(mesh=mesh, offload_policy=settings.offload_policy, ignored_params=settings.ignored_params or None)
    for name, module in reversed(list(model.named_modules())):
        if module is model or isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            continue  # containers have no forward to hook
        own = [p for p in module.parameters() if p not in claimed]
        if own and settings.wrap(name, module, sum(p.numel() for p in own)):
            fully_shard(module, reshard_after_forward=settings.reshard_after_forward, mp_policy=settings.mp_policy,
                        **common)
            claimed.update(module.parameters())  # fully_shard replaced them with sharded ones
    # The root's parameters are needed again as soon as backward starts: keep them unless asked otherwise.
    root_reshard = None if settings.reshard_after_forward is True else settings.reshard_after_forward
    fully_shard(model, reshard_after_forward=root_reshard, mp_policy=settings.root_mp_policy or settings.mp_policy,
                **common)


def broadcast_module_states(model: nn.Module, src: int = 0) -> None:
    """Give every process rank ``src``'s parameters and buffers (skipping any on the meta device)."""
    if not group.is_distributed():
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type != "meta":
                dist.broadcast(tensor.data, src=src)


def non_persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers left out of the state dict (e.g. rotary frequencies), by full name."""
    found = {}
    for name, module in model.named_modules():
        for buffer_name in getattr(module, "_non_persistent_buffers_set", ()):
            buffer = module._buffers.get(buffer_name)
            if buffer is not None:
                found[f"{name}.{buffer_name}" if name else buffer_name] = buffer
    return found


def load_from_rank0(model: nn.Module, full_state: dict[str, torch.Tensor], extra_buffers: dict[str, torch.Tensor],
                    device: torch.device) -> None:
    """Materialise a model sharded on the meta device and fill it from rank 0's full weights.

    Every process allocates only its shards (``to_empty``); ``set_model_state_dict`` broadcasts rank 0's
    tensors and each process keeps its slice. Buffers outside the state dict come from rank 0 too.
    """
    model.to_empty(device=device)
    state: dict[str, Any] = full_state  # torch declares dict[str, ValueType], invariant in the value type
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    box = [{k: v.cpu() for k, v in extra_buffers.items()}]
    dist.broadcast_object_list(box, src=0)
    with torch.no_grad():
        for name, value in box[0].items():
            owner, _, buffer_name = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            module._buffers[buffer_name] = value.to(device)
