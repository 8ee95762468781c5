"""The model path on 2 processes: a DDP user turns on activation checkpointing and regional compilation
with the same settings as an FSDP2 user, and gets the losses of plain PyTorch; every strategy's hooks
come off with ``unwrap_model(keep_fp32_wrapper=False)``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.distributed import run_distributed
from tests.support.parallel import reference_losses, worst

STEPS = 4


def _ddp_and_pipeline() -> dict[str, Any]:
    from overdrive import (
        ActivationCheckpointingKwargs,
        GradientState,
        ParallelismConfig,
        PipelineConfig,
        TorchDynamoPlugin,
    )
    from overdrive.accelerator import Accelerator
    from overdrive.transforms.compile import compiled_in_place
    from tests.support.parallel import accelerated_losses, loss_fn, make_model
    from tests.transforms.test_model_path import is_checkpointed, overdrive_hooks

    def fresh(**kwargs: Any) -> Accelerator:
        GradientState._reset_state()
        return Accelerator(**kwargs)

    found: dict[str, Any] = {}
    plain = fresh()
    found["plain"] = accelerated_losses(plain, 4, STEPS)["losses"]
    both = fresh(kwargs_handlers=[ActivationCheckpointingKwargs()],
                 dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    out = accelerated_losses(both, 4, STEPS)
    inner = both.unwrap_model(out["model"])
    found["checkpointed"] = out["losses"]
    found["strategy"] = both.strategy.name
    found["applied"] = (all(is_checkpointed(b) for b in inner.layers),
                        all(compiled_in_place(b) for b in inner.layers))
    bf16 = fresh(mixed_precision="bf16")
    model = bf16.prepare(make_model())
    found["ddp_hooks"] = (overdrive_hooks(model), overdrive_hooks(bf16.unwrap_model(model, keep_fp32_wrapper=False)))
    config = PipelineConfig(schedule="GPipe", num_microbatches=2, loss_fn=loss_fn)
    pipe = fresh(mixed_precision="bf16", parallelism_config=ParallelismConfig(pp_size=2, pp_handler=config))
    model = pipe.prepare(make_model())
    before = sum(overdrive_hooks(s) for s in model.stage_modules)  # autocast + the pipeline's own
    found["pipeline_hooks"] = (len(pipe.hooks), before)
    pipe.unwrap_model(model, keep_fp32_wrapper=False)
    found["pipeline_after"] = (len(pipe.hooks), sum(overdrive_hooks(s) for s in model.stage_modules))
    return found


@pytest.mark.slow
def test_ddp_activation_checkpointing_and_regional_compile_match_plain_pytorch_and_hooks_come_off():
    results = run_distributed(_ddp_and_pipeline, 2, timeout=240)
    reference = reference_losses(8, STEPS)
    for found in results:
        assert found["strategy"] == "ddp" and found["applied"] == (True, True)
        assert worst(found["plain"], reference) < 1e-5
        assert worst(found["checkpointed"], found["plain"]) < 1e-6
        assert found["ddp_hooks"] == (2, 0)
        count, before = found["pipeline_hooks"]
        assert count == 2 and found["pipeline_after"] == (0, before - 2)  # the autocast pair came off
