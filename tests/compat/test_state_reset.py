"""``AcceleratorState._reset_state()`` as in Accelerate: an Accelerator built before it reads as reset (its
process attributes and ``prepare`` raise the AttributeError that names ``_reset_state()``), unknown names keep
Python's message, new attributes can still be set, ``_shared_state`` empties, and the next Accelerator
brings the old one's state back; compared with the real
Accelerate running the same code."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate")]


def _after_reset(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    def error(read) -> str | None:
        try:
            read()
        except AttributeError as exc:
            text = str(exc)
            return ("reset" if "This happens if `AcceleratorState._reset_state()`" in text
                    else "unknown" if "'AcceleratorState' object has no attribute" in text else text)
        return None

    out: dict = {}
    accelerator = Accelerator(cpu=True)
    out["before"] = (accelerator.num_processes, error(lambda: accelerator.state.someotherthing),
                     AcceleratorState._shared_state != {}, AcceleratorState().num_processes)
    AcceleratorState._reset_state()
    out["shared_after"] = AcceleratorState._shared_state
    out["partial_kept"] = PartialState._shared_state != {}
    out["num_processes"] = error(lambda: accelerator.num_processes)
    out["state_device"] = error(lambda: accelerator.state.device)
    out["prepare"] = error(lambda: accelerator.prepare(torch.nn.Linear(1, 1)))
    again = Accelerator(cpu=True)  # a new Accelerator works again, and the old one answers with it
    out["again"] = (again.num_processes, AcceleratorState._shared_state != {}, accelerator.num_processes)
    AcceleratorState._reset_state()
    accelerator.state.someotherthing = "MyValue"
    out["set_after"] = (accelerator.state.someotherthing, error(lambda: again.num_processes))
    AcceleratorState._reset_state(reset_partial_state=True)
    out["both_reset"] = (AcceleratorState._shared_state, PartialState._shared_state)
    return out


def test_reset_state_reaches_existing_accelerators_as_in_accelerate():
    theirs = run_function(_after_reset, "accelerate")
    ours = run_function(_after_reset, "overdrive")
    assert ours == theirs
    assert theirs["num_processes"] == theirs["prepare"] == "reset" and theirs["before"][1] == "unknown"
