"""Accelerate's Accelerator attributes that libraries and scripts read (transformers reads ``_models``)."""

from __future__ import annotations

import pytest
import torch

from overdrive import Accelerator, DistributedDataParallelKwargs, GradScalerKwargs


def test_handlers_settings_trackers_and_prepared_lists():
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ddp, GradScalerKwargs(init_scale=8.0)],
                              rng_types=["torch"], log_with="csv", project_dir="unused")
    assert isinstance(accelerator.ddp_handler, DistributedDataParallelKwargs)
    assert accelerator.scaler_handler.init_scale == 8.0
    assert accelerator.autocast_handler is not None and accelerator.profile_handler is None
    assert accelerator.rng_types == ["torch"] and accelerator.log_with == ["csv"]
    assert accelerator.trackers == []
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    assert accelerator._models == [model] and accelerator._optimizers == []
    assert accelerator.state.fsdp_plugin is None


def test_native_amp_is_settable_and_honoured():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.is_autocast_enabled("cpu"))
            return x

    model = accelerator.prepare(Probe())
    assert accelerator.native_amp is True
    model(torch.ones(1))
    accelerator.native_amp = False
    model(torch.ones(1))
    accelerator.native_amp = True
    model(torch.ones(1))
    assert seen == [True, False, True]
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(cpu=True).native_amp = True
