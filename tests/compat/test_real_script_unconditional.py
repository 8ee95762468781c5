"""tests/scripts/real/train_unconditional.py (diffusers' unconditional image example's shape, without
diffusers: an EMA saved and loaded by save/load pre-hooks registered only ``if version.parse(
accelerate.__version__) >= version.parse("0.16.0")``, ``save_state`` on the main process only, the example's
resume arithmetic and batch skipping) under the real Accelerate and under ``overdrive launch --as_accelerate``,
on 1 and 2 gloo CPU processes, the same seed: the final and EMA weights bit for bit, the checkpoint folders'
files, and resumes from either side's checkpoint.

A resumed run is compared with the real Accelerate's own resumed run: the noise comes from the global RNG, and
the epoch's iterator takes one draw from it after ``load_state`` where the uninterrupted run took it before the
checkpoint, so neither engine's resumed run draws the uninterrupted run's noise.
"""

from __future__ import annotations

import pytest

from tests.support.real_scripts import Script, ScriptRuns, assert_same_weights, process_counts, without

pytestmark = [pytest.mark.requires("accelerate", "packaging"), pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.timeout(1500)]
# 16 images in batches of 2 per process, accumulation 2: checkpoint-3 is 6 of 8 batches into the first epoch
# on 1 process, 2 of 4 batches into the second on 2
UNCONDITIONAL = Script("train_unconditional.py", ("--seed", "7", "--use_ema", "--checkpointing_steps", "3"),
                       checkpoint=lambda processes: "checkpoint-3", weights=("model.safetensors", "ema.safetensors"))


@pytest.fixture(scope="module", params=process_counts(2), ids=lambda n: f"{n}proc")
def runs(request, tmp_path_factory) -> ScriptRuns:
    return ScriptRuns(tmp_path_factory.mktemp(f"unconditional_{request.param}"), UNCONDITIONAL, request.param)


def test_full_runs_end_with_the_same_weights_and_ema(runs):
    ours, theirs = runs.full("overdrive"), runs.full("accelerate")
    for name in UNCONDITIONAL.weights:
        assert_same_weights(ours.weights(name), theirs.weights(name), name)
    results = theirs.results()
    assert results["hooks_registered"] and results["global_step"] == results["ema_step"] == 8 // runs.processes
    assert without(ours.results(), "logged", "hooks_registered") == without(results, "logged", "hooks_registered")


def test_checkpoint_folders_hold_the_same_files(runs):
    ours, theirs = runs.full("overdrive").checkpoints(), runs.full("accelerate").checkpoints()
    assert sorted(ours) == sorted(theirs) == ["checkpoint-3", "checkpoint-6"][:1 if runs.processes == 2 else 2]
    for name, files in theirs.items():
        assert {"unet/diffusion_pytorch_model.safetensors", "unet_ema/config.json"} <= set(files)
        assert set(files) <= set(ours[name]), (name, files, ours[name])


def test_accelerate_resumes_its_own_checkpoint_mid_epoch(runs):
    """The reference of the resumed runs below: the real Accelerate resumes its own checkpoint as the example means."""
    results = runs.resumed("accelerate", "accelerate").results()
    assert results["skipped"] == (6 if runs.processes == 1 else 2)  # the example's own skipping, mid-epoch
    assert results["global_step"] == results["ema_step"] == 8 // runs.processes  # the EMA's counter was loaded
    assert results["hooks_registered"] and results["first_epoch"] == (0 if runs.processes == 1 else 1)


@pytest.mark.parametrize("engine,written_by", [
    ("overdrive", "overdrive"),
    ("overdrive", "accelerate"),
    ("accelerate", "overdrive"),
])
def test_resumed_runs_end_as_accelerates_resumed_run(runs, engine, written_by):
    reference = runs.resumed("accelerate", "accelerate")
    resumed = runs.resumed(engine, written_by)
    for name in UNCONDITIONAL.weights:
        assert_same_weights(resumed.weights(name), reference.weights(name), name)
    assert without(resumed.results(), "logged") == without(reference.results(), "logged")


def test_the_version_check_passes_and_enums_print_as_under_accelerate(runs):
    ours, theirs = runs.full("overdrive").results(), runs.full("accelerate").results()
    assert ours["hooks_registered"] and ours["logged"] == theirs["logged"]
