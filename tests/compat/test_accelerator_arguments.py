"""``Accelerator(split_batches=True)`` is accepted and ignored, as the real Accelerate 1.15 does (the setting lives
in ``DataLoaderConfiguration``); overdrive also warns that it is ignored. The same script under both."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate")]


def _split_batches(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    import warnings

    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration

    out = {}
    for name, kwargs in (("argument", {"split_batches": True}),
                         ("config", {"dataloader_config": DataLoaderConfiguration(split_batches=True)})):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelerator = Accelerator(cpu=True, **kwargs)
        loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=4))
        out[name] = (accelerator.split_batches, accelerator.dataloader_config.split_batches,
                     [batch.tolist() for batch in loader])
        out[f"{name}_warned"] = any("split_batches" in str(w.message) for w in caught)
    return out


def test_split_batches_argument_is_ignored_as_in_accelerate():
    theirs = run_function(_split_batches, "accelerate")
    ours = run_function(_split_batches, "overdrive")
    assert ours["argument"] == theirs["argument"] and ours["config"] == theirs["config"]
    assert theirs["argument"][0] is False and theirs["config"][0] is True
    assert ours["argument_warned"] and not ours["config_warned"]  # overdrive says the argument is ignored
