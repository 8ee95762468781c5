"""Layer queries of ``accelerate.utils.ao`` / ``bnb`` / ``transformer_engine`` (what kind of layers a model has), and
Accelerate's torchao conversion helpers."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from torch import nn

from overdrive.precision.fp8 import first_and_last_linear


def _has_layer(model: nn.Module, module: str, names: tuple[str, ...]) -> bool:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return False
    return any(type(layer).__name__ in names and type(layer).__module__.startswith(module.split(".")[0])
               for layer in model.modules())


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds Transformer Engine layers (False when TE is not installed)."""
    return _has_layer(model, "transformer_engine", ("LayerNorm", "Linear", "TransformerLayer"))


def has_ao_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds torchao float8 linear layers."""
    return _has_layer(model, "torchao", ("Float8Linear",))


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes 4-bit linear layers."""
    return _has_layer(model, "bitsandbytes", ("Linear4bit",))


def find_first_last_linear_layers(model: nn.Module) -> tuple[str | None, str | None]:
    """The names of ``model``'s first and last ``nn.Linear`` (in module order), None without one."""
    return first_and_last_linear(model)


def filter_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """torchao's ``module_filter_fn`` as Accelerate writes it: False (keep in high precision) for a linear layer
    with a size that is not a multiple of 16 (fp8 kernels need them) and for the names in ``layers_to_filter``."""
    if isinstance(module, nn.Linear) and (module.in_features % 16 != 0 or module.out_features % 16 != 0):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str) -> bool:
    """Accelerate's ``filter_linear_layers`` with the first and last linear layers found in ``module`` itself.
    torchao calls a filter once per layer, so there this only applies the multiple-of-16 rule (as in
    Accelerate); ``convert_model_to_fp8_ao`` finds the first and last layers in the whole model."""
    return filter_linear_layers(module, fqn, list(find_first_last_linear_layers(module)))


def convert_model_to_fp8_ao(model: nn.Module, config: Any = None,
                            module_filter_func: Callable[[nn.Module, str], bool] | None = None) -> None:
    """Swap ``model``'s ``nn.Linear`` layers for torchao's ``Float8Linear`` in place (torchao's
    ``convert_to_float8_training`` with ``config``), except, by default, the model's first and last linear
    layers and those with a size that is not a multiple of 16. The Accelerator does this itself under
    ``mixed_precision="fp8"``; this is Accelerate's function for code that converts by hand."""
    from torchao.float8 import convert_to_float8_training  # lazy: optional dependency

    if module_filter_func is None:
        module_filter_func = functools.partial(filter_linear_layers,
                                               layers_to_filter=list(find_first_last_linear_layers(model)))
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
