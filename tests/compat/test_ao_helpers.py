"""Accelerate's torchao helpers (``accelerate.utils.ao``) under the alias give what the real Accelerate's give:
``convert_model_to_fp8_ao`` converts the same layers (not the first and last linear layers, nor those with a
size that is not a multiple of 16), and the filter functions answer alike."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate", "torchao")]


def _ao(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    import torch
    from accelerate.utils.ao import (
        convert_model_to_fp8_ao,
        filter_first_and_last_linear_layers,
        filter_linear_layers,
        find_first_last_linear_layers,
    )

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                   torch.nn.Linear(64, 24), torch.nn.Linear(24, 64), torch.nn.Linear(64, 32))

    def converted(m: torch.nn.Module) -> list[str]:
        return [name for name, layer in m.named_modules() if type(layer).__name__ == "Float8Linear"]

    default = model()
    convert_model_to_fp8_ao(default)
    custom = model()
    convert_model_to_fp8_ao(custom, module_filter_func=lambda module, fqn: fqn != "2")
    probe = model()
    return {
        "default": converted(default), "custom": converted(custom),
        "first_last": find_first_last_linear_layers(probe),
        "filter": [filter_linear_layers(layer, name, ["0"]) for name, layer in probe.named_children()],
        "first_and_last_filter": [filter_first_and_last_linear_layers(layer, name)
                                  for name, layer in probe.named_children()],
    }


def test_torchao_helpers_match_accelerate():
    theirs = run_function(_ao, "accelerate")
    ours = run_function(_ao, "overdrive")
    assert ours == theirs
    assert theirs["default"] == ["2"]  # the first (0) and last (5) skipped, and the two with a size of 24
