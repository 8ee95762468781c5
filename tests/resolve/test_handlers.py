"""split_kwargs_handlers: each kwargs handler goes to its slot; an unknown object or a kind given twice is refused
naming it and the valid handlers."""

from __future__ import annotations

import pytest

from overdrive.config import (
    ActivationCheckpointingKwargs,
    AORecipeKwargs,
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    TERecipeKwargs,
)
from overdrive.resolve.handlers import split_kwargs_handlers

HANDLERS = {"ddp": DistributedDataParallelKwargs(), "scaler": GradScalerKwargs(), "autocast": AutocastKwargs(),
            "profile": ProfileKwargs(), "init": InitProcessGroupKwargs(), "fp8": AORecipeKwargs(),
            "checkpointing": ActivationCheckpointingKwargs()}


def test_no_handlers_fill_no_slot():
    assert split_kwargs_handlers(None) == {} and split_kwargs_handlers([]) == {}


def test_each_handler_goes_to_its_slot_as_the_same_object():
    found = split_kwargs_handlers(list(HANDLERS.values()))
    assert found.keys() == HANDLERS.keys()
    assert all(found[slot] is handler for slot, handler in HANDLERS.items())
    assert split_kwargs_handlers([TERecipeKwargs()])["fp8"].__class__ is TERecipeKwargs


def test_an_object_that_is_no_handler_is_refused_naming_it_and_the_valid_handlers():
    with pytest.raises(ValueError) as info:
        split_kwargs_handlers([GradScalerKwargs(), "ddp"])
    text = str(info.value)
    assert text.startswith("kwargs_handlers got 'ddp', which is not valid; choose from ")
    for name in ("DistributedDataParallelKwargs", "GradScalerKwargs", "AutocastKwargs", "AORecipeKwargs"):
        assert name in text


def test_a_handler_kind_given_twice_is_refused():
    with pytest.raises(ValueError, match="kwargs_handlers has two GradScalerKwargs objects; give one"):
        split_kwargs_handlers([GradScalerKwargs(), GradScalerKwargs(init_scale=2.0)])
    with pytest.raises(ValueError, match=r"two fp8 recipes \(AORecipeKwargs and TERecipeKwargs\); give one"):
        split_kwargs_handlers([AORecipeKwargs(), TERecipeKwargs()])
