"""fp8 training: torchao's float8 linear layers (``AORecipeKwargs``) or Transformer Engine (``TERecipeKwargs``).

``resolve_fp8`` decides, without importing either library, which recipe a job uses and whether it can run
here (the Accelerator and ``overdrive launch`` both ask it, so a missing package or GPU is reported once,
before training). ``apply_fp8(model, recipe)`` converts a model in place; it runs first in the model path,
before tensor parallel, ``fully_shard`` and ``torch.compile``, which must all see the float8 modules.

    recipe = AORecipeKwargs(config="rowwise")
    replaced = apply_fp8(model, recipe)   # the same as torchao.float8.convert_to_float8_training
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from overdrive.config import AO_RECIPE_NAMES, AORecipeKwargs, TERecipeKwargs
from overdrive.config.choices import invalid_choice

FP8_BACKENDS = ("AO", "TE")
Fp8Recipe = AORecipeKwargs | TERecipeKwargs
#: the packages behind each backend, and how to install them
_PACKAGES = {"AO": ("torchao", "pip install torchao"),
             "TE": ("transformer_engine", "pip install transformer-engine[pytorch] (CUDA only)")}
#: the launch config's fp8_config keys (Accelerate's YAML names) -> TERecipeKwargs fields
_TE_CONFIG_KEYS = {"use_autocast_during_eval": "use_autocast_during_eval", "margin": "margin",
                   "interval": "interval", "fp8_format": "fp8_format", "amax_history_length": "amax_history_len",
                   "amax_history_len": "amax_history_len", "amax_compute_algorithm": "amax_compute_algo",
                   "amax_compute_algo": "amax_compute_algo", "override_linear_precision": "override_linear_precision",
                   "use_mxfp8_block_scaling": "use_mxfp8_block_scaling"}
_AO_CONFIG_KEYS = ("enable_fsdp_float8_all_gather", "pad_inner_dim")


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (looked up without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def fp8_unavailable(backend: str | None, device_type: str | None, device_index: int | None = None) -> str | None:
    """Why fp8 training with ``backend`` ("AO", "TE"; None: whichever is installed) cannot run on a device of
    ``device_type``, or None when it can. Imports neither library: cheap enough for the launcher."""
    backend = default_backend() if backend is None else str(backend).upper()
    if backend == "NONE":
        return (f"mixed_precision='fp8' needs torchao ({_PACKAGES['AO'][1]}) or Transformer Engine "
                f"({_PACKAGES['TE'][1]}); neither is installed")
    if backend == "MSAMP":  # Accelerate's third back end
        return "fp8 backend 'MSAMP' (MS-AMP) is not supported by overdrive; choose from AO (torchao), TE (Transformer Engine)"
    if backend not in FP8_BACKENDS:
        return invalid_choice(f"fp8 backend {backend!r}", backend, FP8_BACKENDS) + " (AO: torchao, TE: Transformer Engine)"
    package, how = _PACKAGES[backend]
    if not installed(package):
        return f"fp8 with backend {backend} needs {package}, which is not installed ({how})"
    device_type = device_type or "cpu"
    if backend == "TE" and device_type != "cuda":
        return f"Transformer Engine fp8 runs on CUDA GPUs only, not on {device_type!r}; use AORecipeKwargs (torchao)"
    if device_type == "cuda":
        major, minor = torch.cuda.get_device_capability(device_index)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device_index)
            return (f"fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); {name} has "
                    f"{major}.{minor}; use mixed_precision='bf16'")
    elif device_type != "cpu":
        return f"torchao fp8 training runs on CUDA GPUs (and slowly on the CPU), not on {device_type!r}"
    return None


def default_backend() -> str:
    """torchao when installed, else Transformer Engine when installed, else "NONE"."""
    return "AO" if installed("torchao") else "TE" if installed("transformer_engine") else "NONE"


def recipe_from_launch_config(fp8_config: dict[str, Any] | None, errors: list[str]) -> Fp8Recipe | None:
    """The recipe a launch config's ``fp8_config`` (Accelerate's YAML keys) asks for, or None."""
    if not fp8_config:
        return None
    backend = str(fp8_config.get("backend") or default_backend()).upper()
    if backend == "TE":
        given = {_TE_CONFIG_KEYS[k]: v for k, v in fp8_config.items() if k in _TE_CONFIG_KEYS}
        try:
            return TERecipeKwargs(**given)
        except (TypeError, ValueError) as exc:
            errors.append(f"fp8_config: {exc}")
            return None
    if backend == "AO":
        return AORecipeKwargs(**{k: fp8_config[k] for k in _AO_CONFIG_KEYS if k in fp8_config})
    errors.append(fp8_unavailable(backend, None) or f"fp8_config backend {backend!r} is not supported")
    return None


def resolve_fp8(handler: Fp8Recipe | None, launched: dict[str, Any] | None, mixed_precision: str, device: torch.device,
                strategy: str, shards_parameters: bool, errors: list[str],
                efficient_loading: bool = False) -> Fp8Recipe | None:
    """The recipe this job trains with (None without fp8), its defaults filled in; every problem is appended
    to ``errors``: a recipe without ``mixed_precision='fp8'``, a missing package or GPU, a layout the
    backend does not support."""
    if mixed_precision != "fp8":
        if handler is not None:
            errors.append(f"kwargs_handlers got {type(handler).__name__}, which needs mixed_precision='fp8' "
                          f"(got {mixed_precision!r})")
        return None
    recipe = handler if handler is not None else recipe_from_launch_config(launched, errors)
    backend = recipe.backend if recipe is not None else None
    problem = fp8_unavailable(backend, device.type, device.index)
    if problem:
        errors.append(problem)
        return None
    if recipe is None:
        recipe = AORecipeKwargs() if default_backend() == "AO" else TERecipeKwargs()
    if isinstance(recipe, TERecipeKwargs):
        if strategy not in ("single", "ddp"):
            errors.append(f"Transformer Engine fp8 runs with one process or DDP in overdrive, not with {strategy}; "
                          "use AORecipeKwargs (torchao composes with FSDP2 and tensor parallel)")
        return recipe
    if strategy == "pipeline":  # (DeepSpeed reports fp8 itself)
        errors.append(f"mixed_precision='fp8' is not supported with {strategy} yet; use 'bf16'")
    if efficient_loading and shards_parameters:
        errors.append("mixed_precision='fp8' with cpu_ram_efficient_loading=True is not supported: torchao converts "
                      "the weights where they are, and only rank 0 holds them; set cpu_ram_efficient_loading=False")
    return _fill_ao_defaults(recipe, shards_parameters, errors)


def _fill_ao_defaults(recipe: AORecipeKwargs, shards_parameters: bool, errors: list[str]) -> AORecipeKwargs:
    config = recipe.config
    if config is not None and not isinstance(config, str):
        if recipe.pad_inner_dim is not None or recipe.enable_fsdp_float8_all_gather is not None:
            errors.append("AORecipeKwargs got a Float8LinearConfig and pad_inner_dim/enable_fsdp_float8_all_gather: "
                          "set those on the Float8LinearConfig")
        return recipe
    name = (config or "tensorwise").lower()
    if name not in AO_RECIPE_NAMES:
        errors.append(invalid_choice(f"AORecipeKwargs(config={config!r})", config, AO_RECIPE_NAMES)
                      + "; or give a torchao.float8.Float8LinearConfig")
        return recipe
    all_gather = recipe.enable_fsdp_float8_all_gather
    if all_gather and name != "tensorwise":
        errors.append(f"enable_fsdp_float8_all_gather=True needs tensorwise scaling; recipe {name!r} scales by rows")
    if all_gather and not shards_parameters:
        errors.append("enable_fsdp_float8_all_gather=True needs FSDP2 to shard the parameters (fsdp_plugin or "
                      "dp_shard_size > 1); leave it unset")
    if all_gather is None:
        # fp8 all-gather only pays when FSDP2 gathers the weights; with DDP the weights stay plain tensors
        all_gather = shards_parameters and name == "tensorwise"
    pad = True if recipe.pad_inner_dim is None else recipe.pad_inner_dim
    return dataclasses.replace(recipe, config=name, pad_inner_dim=pad, enable_fsdp_float8_all_gather=bool(all_gather))


# -- converting a model -----------------------------------------------------------------------------------
def float8_linear_config(recipe: AORecipeKwargs) -> Any:
    """The ``torchao.float8.Float8LinearConfig`` of ``recipe``."""
    from torchao.float8 import Float8LinearConfig  # lazy: optional dependency

    config = recipe.config
    if config is None or isinstance(config, str):
        base = Float8LinearConfig.from_recipe_name(config or "tensorwise")
        changes = {"pad_inner_dim": bool(recipe.pad_inner_dim),
                   "enable_fsdp_float8_all_gather": bool(recipe.enable_fsdp_float8_all_gather)}
        return dataclasses.replace(base, **changes)
    if not isinstance(config, Float8LinearConfig):
        raise TypeError(f"AORecipeKwargs(config=...) must be a torchao Float8LinearConfig or a recipe name "
                        f"{AO_RECIPE_NAMES}, got {type(config).__name__}")
    return config


def first_and_last_linear(model: nn.Module) -> tuple[str | None, str | None]:
    """The names of ``model``'s first and last ``nn.Linear`` (in module order)."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def default_module_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """Accelerate's default: convert every linear layer except the first and the last (the most sensitive to
    quantisation) and those whose dimensions do not divide by 16 (float8 matmuls need multiples of 16)."""
    skip = set(first_and_last_linear(model)) - {None}

    def keep(module: nn.Module, fqn: str) -> bool:
        if fqn in skip:
            return False
        return not isinstance(module, nn.Linear) or (module.in_features % 16 == 0 and module.out_features % 16 == 0)

    return keep


def apply_fp8(model: nn.Module, recipe: Fp8Recipe) -> dict[int, tuple[weakref.ref, nn.Parameter]]:
    """Convert ``model`` in place for fp8 training with ``recipe``.

    torchao: ``convert_to_float8_training(model, module_filter_fn=..., config=...)``. Transformer Engine:
    linear and layer-norm modules swapped for TE's (sharing the parameters) and the forward run in
    ``te.fp8_autocast``. Returns the parameters that were replaced by new objects (torchao wraps weights for
    fp8 all-gather) as ``{id(old): (weakref(old), new)}``, so optimizers built earlier can be pointed at them.
    """
    if isinstance(recipe, TERecipeKwargs):
        _apply_te(model, recipe)
        return {}
    from torchao.float8 import convert_to_float8_training  # lazy: optional dependency

    before = {name: p for name, p in model.named_parameters()}
    module_filter = recipe.module_filter_func or default_module_filter(model)
    convert_to_float8_training(model, module_filter_fn=module_filter, config=float8_linear_config(recipe))
    after = dict(model.named_parameters())
    return {id(old): (weakref.ref(old), after[name]) for name, old in before.items()
            if name in after and after[name] is not old}


def repoint_optimizer(optimizer: torch.optim.Optimizer, replaced: dict[int, tuple[weakref.ref, nn.Parameter]]) -> None:
    """Point ``optimizer`` at the parameters ``apply_fp8`` put in place of the ones it was built with."""
    if not replaced:
        return
    for group in optimizer.param_groups:
        group["params"] = [_current(p, replaced) for p in group["params"]]


def _current(param: torch.Tensor, replaced: dict[int, tuple[weakref.ref, nn.Parameter]]) -> torch.Tensor:
    entry = replaced.get(id(param))
    return entry[1] if entry is not None and entry[0]() is param else param


def uses_fp8_all_gather(model: nn.Module) -> bool:
    """Whether ``model`` holds torchao weights that FSDP2 all-gathers in float8."""
    if not any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return False
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor  # lazy: optional dependency

    return any(isinstance(getattr(p, "_local_tensor", None), WeightWithDynamicFloat8CastTensor)
               for p in model.parameters())


def precompute_scales_after_step(optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> Any:
    """After each step of ``optimizer``, compute the float8 scales of the FSDP2-sharded weights of ``models``
    in one all-reduce (torchao's ``precompute_float8_dynamic_scale_for_fsdp``) instead of one per weight.
    Returns the hook handle, or None when no model all-gathers in float8."""
    chosen = [m for m in models if uses_fp8_all_gather(m)]
    if not chosen:
        return None
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp  # lazy: optional dependency

    def precompute(*_: Any) -> None:
        for model in chosen:
            precompute_float8_dynamic_scale_for_fsdp(model)

    return optimizer.register_step_post_hook(precompute)


# -- Transformer Engine ----------------------------------------------------------------------------------
def _apply_te(model: nn.Module, recipe: TERecipeKwargs) -> None:
    import transformer_engine.pytorch as te  # pyright: ignore[reportMissingImports]  # lazy: optional, not in the test extra

    _swap_te_modules(model, te)
    fp8_recipe = _te_recipe(recipe)
    stack: list[contextlib.AbstractContextManager] = []

    def enter(module: nn.Module, args: Any) -> None:
        region = te.fp8_autocast(enabled=module.training or recipe.use_autocast_during_eval, fp8_recipe=fp8_recipe)
        region.__enter__()
        stack.append(region)

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def _te_recipe(recipe: TERecipeKwargs) -> Any:
    from transformer_engine.common import recipe as te_recipe  # pyright: ignore[reportMissingImports]  # lazy: optional, not in the test extra

    given = recipe.to_kwargs()  # only what differs from the defaults: TE versions differ in what they take
    given.pop("use_autocast_during_eval", None)
    if given.pop("use_mxfp8_block_scaling", False):
        return te_recipe.MXFP8BlockScaling(**{k: v for k, v in given.items() if k in ("margin", "fp8_format")})
    if "fp8_format" in given:
        given["fp8_format"] = getattr(te_recipe.Format, given["fp8_format"])
    return te_recipe.DelayedScaling(**given)


def _swap_te_modules(model: nn.Module, te: Any) -> None:
    """``nn.Linear`` (dimensions divisible by 16) and ``nn.LayerNorm`` -> TE's, sharing the parameter objects so
    that optimizers built on the model keep training them."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.in_features % 16 == 0 and child.out_features % 16 == 0:
                new = te.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                params_dtype=child.weight.dtype, device=child.weight.device)
            elif (type(child) is nn.LayerNorm and len(child.normalized_shape) == 1 and child.elementwise_affine
                  and child.bias is not None):
                new = te.LayerNorm(child.normalized_shape[0], eps=child.eps, params_dtype=child.weight.dtype,
                                   device=child.weight.device)
            else:
                continue
            new.weight = child.weight
            if child.bias is not None:
                new.bias = child.bias
            setattr(parent, name, new)
