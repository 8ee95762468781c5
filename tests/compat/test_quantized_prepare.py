"""``prepare`` of a model loaded in 8 or 4 bits (bitsandbytes' ``is_loaded_in_8bit`` / ``hf_device_map``) refuses
what Accelerate refuses (CPU or disk offload, unless bitsandbytes' multi-backend build runs it on the CPU) and
prepares what it prepares; the same script under the real Accelerate and under the alias."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate")]


def _quantized(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    from unittest.mock import patch

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)

    def outcome(device_map: dict | None, multi_backend: bool = False, bits: str = "8bit") -> str:
        model = torch.nn.Linear(2, 2)
        if device_map is not None:
            setattr(model, f"is_loaded_in_{bits}", True)
            model.hf_device_map = device_map  # pyright: ignore[reportAttributeAccessIssue]
        with patch("accelerate.accelerator.is_bitsandbytes_multi_backend_available", return_value=multi_backend):
            try:
                accelerator.prepare_model(model)
            except ValueError as exc:
                return "offload" if "CPU or disk offload" in str(exc) else f"ValueError: {exc}"
            except Exception as exc:  # noqa: BLE001 - the kind of error is what is compared
                return type(exc).__name__
        return "prepared"

    return {
        "cpu": outcome({"": "cpu"}), "cpu_4bit": outcome({"": "cpu"}, bits="4bit"),
        "disk": outcome({"": "disk"}), "cpu_and_disk": outcome({"a": "cpu", "b": "disk"}),
        "cpu_multi_backend": outcome({"": "cpu"}, multi_backend=True),
        "disk_multi_backend": outcome({"": "disk"}, multi_backend=True),
        "no_device_map": outcome({}), "plain": outcome(None),
    }


def test_quantized_models_are_refused_as_accelerate_refuses_them():
    theirs = run_function(_quantized, "accelerate")
    ours = run_function(_quantized, "overdrive")
    assert ours == theirs
    assert theirs["cpu"] == theirs["cpu_4bit"] == theirs["cpu_and_disk"] == "offload"
    assert theirs["cpu_multi_backend"] == theirs["plain"] == "prepared"
