"""resolve_training through ``Accelerator(...)``: a bad argument is refused with the value given and the valid
choices, and every problem of one call is reported at once."""

from __future__ import annotations

import pytest

from overdrive import Accelerator, GradientAccumulationPlugin
from overdrive.config import ParallelismConfig


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mixed_precision": "fp32"}, ["'fp32'", "bf16", "fp16", "no"]),
        ({"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps=0", ">= 1"]),
        ({"gradient_accumulation_steps": 2, "gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=2)},
         ["gradient_accumulation_plugin", "one place"]),
        ({"mixed_precision": "fp8-ish", "gradient_accumulation_steps": -1}, ["fp8-ish", "gradient_accumulation_steps=-1"]),
        ({"rng_types": ["dice"]}, ["dice", "generator"]),
        ({"kwargs_handlers": [object()]}, ["kwargs_handlers", "GradScalerKwargs"]),
    ],
)
def test_bad_arguments_name_the_value_and_the_choices(kwargs, words):
    with pytest.raises(ValueError) as info:
        Accelerator(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_context_parallel_on_cpu_is_refused_before_training_with_every_other_problem():
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2))
    text = str(info.value)
    assert "context parallelism, which needs CUDA" in text and "product is 2 but there are 1 processes" in text
