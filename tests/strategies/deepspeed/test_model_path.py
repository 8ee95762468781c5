"""DeepSpeed models go through the same model path: activation checkpointing and compile (whole or regional)
mean what they mean under every other strategy, and ``unwrap_model(keep_fp32_wrapper=False)`` takes off
every hook overdrive put on the module (DeepSpeed's own stay: the engine needs them)."""

from __future__ import annotations

import pytest
import torch

from overdrive import (
    Accelerator,
    ActivationCheckpointingKwargs,
    DeepSpeedPlugin,
    GradientState,
    TorchDynamoPlugin,
)
from overdrive.transforms.compile import compiled_in_place
from tests.support.parallel import accelerated_losses, make_model, reference_losses, worst
from tests.transforms.test_model_path import is_checkpointed, overdrive_hooks

pytestmark = [pytest.mark.usefixtures("one_process_group"), pytest.mark.deepspeed]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_activation_checkpointing_and_regional_compile_under_deepspeed_match_plain_pytorch(stage: int) -> None:
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=0.0),
                              kwargs_handlers=[ActivationCheckpointingKwargs()],
                              dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    out = accelerated_losses(accelerator, 8, 3)
    assert accelerator.strategy.name == "deepspeed"
    assert worst(out["losses"], reference_losses(8, 3)) < 1e-5
    inner = accelerator.unwrap_model(out["model"])
    assert all(is_checkpointed(block) for block in inner.layers)
    assert all(compiled_in_place(block) for block in inner.layers)
    assert not compiled_in_place(inner)  # regional: the blocks, not the whole model
    accelerator.free_memory()


def test_whole_model_compile_under_deepspeed_and_hooks_come_off() -> None:
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.0),
                              mixed_precision="bf16", dynamo_backend="eager")
    model = accelerator.prepare(make_model())
    inner = accelerator.unwrap_model(model)
    assert compiled_in_place(inner) and not any(is_checkpointed(b) for b in inner.layers)
    with torch.no_grad():
        out = model(torch.zeros(2, 8, dtype=torch.long))
    assert out.dtype == torch.float32  # the engine's bf16 outputs come back in fp32 (a hook of the registry)
    before = overdrive_hooks(inner)  # the registry's cast pair, and DeepSpeed's own hooks
    assert len(accelerator.hooks) == 2
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain is inner and len(accelerator.hooks) == 0 and overdrive_hooks(plain) == before - 2
    with torch.no_grad():
        assert model(torch.zeros(2, 8, dtype=torch.long)).dtype == torch.bfloat16  # the cast pair is gone
    accelerator.free_memory()
