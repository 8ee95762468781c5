"""Layer queries of ``accelerate.utils.ao`` / ``bnb`` / ``transformer_engine``: what kind of layers a model has."""

from __future__ import annotations

from typing import Any

from torch import nn

from overdrive.compat.unsupported import refusing_function


def _has_layer(model: nn.Module, module: str, names: tuple[str, ...]) -> bool:
    import importlib.util

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


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """torchao's ``module_filter_fn`` that keeps the named (first and last) linear layers in high precision,
    and layers whose sizes are not multiples of 16 (fp8 kernels need them)."""
    if isinstance(module, nn.Linear):
        if module.in_features % 16 != 0 or module.out_features % 16 != 0:
            return False
    return fqn not in layers_to_filter


convert_model_to_fp8_ao: Any = refusing_function(
    "convert_model_to_fp8_ao", "the fp8 conversion is applied by the Accelerator in its model path",
    "use Accelerator(mixed_precision='fp8') (torchao)")
