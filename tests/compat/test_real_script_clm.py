"""tests/scripts/real/run_clm_no_trainer.py (transformers' causal-LM example's shape: a tiny GPT-2 whose
``lm_head.weight`` IS ``transformer.wte.weight``, dropout off, ``step_N`` checkpoints, a resume in the middle
of the first epoch with ``skip_first_batches``, perplexity through ``gather_for_metrics``, the unwrapped
model's ``save_pretrained``) under the real Accelerate and under ``overdrive launch --as_accelerate``, on 1
gloo CPU process (and 2 with ``OVERDRIVE_TEST_REAL_SCRIPTS=all``; the default suite compares 2 processes with
the unconditional script), the same seed: the final weights bit for bit, the checkpoint folders' files, and
resumes from either side's checkpoint.

A resumed run is compared with the real Accelerate's own resumed run. On 2 processes that is the uninterrupted
run's result too (the prepared sampler's generator is seeded when the loader is prepared, the resume is in the
first epoch, no dropout); on 1 process Accelerate shuffles with the global RNG, drawn again after ``load_state``
when the resumed epoch starts, so its resumed run takes other batches.
"""

from __future__ import annotations

import pytest

from tests.support.real_scripts import Script, ScriptRuns, assert_same_weights, process_counts, without

pytestmark = [pytest.mark.requires("accelerate", "transformers"), pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.timeout(1500)]
# 32 blocks in batches of 4 per process, accumulation 2: 4 // processes optimizer steps an epoch; the checkpoint
# is half-way through the first epoch
CLM = Script("run_clm_no_trainer.py", ("--seed", "7", "--checkpointing_steps", "1"),
             checkpoint=lambda processes: f"step_{2 // processes}")


@pytest.fixture(scope="module", params=process_counts(1), ids=lambda n: f"{n}proc")
def runs(request, tmp_path_factory) -> ScriptRuns:
    return ScriptRuns(tmp_path_factory.mktemp(f"clm_{request.param}"), CLM, request.param)


def test_full_runs_end_with_the_same_weights_and_perplexity(runs):
    ours, theirs = runs.full("overdrive"), runs.full("accelerate")
    assert_same_weights(ours.weights("model.safetensors"), theirs.weights("model.safetensors"), "model")
    results = theirs.results()
    assert results["tied"] and results["evaluated"] == 10 and results["completed_steps"] == 8 // runs.processes
    assert "lm_head.weight" not in theirs.weights("model.safetensors")  # stored once, as wte
    assert without(ours.results(), "logged") == without(results, "logged")


def test_checkpoint_folders_hold_the_same_files(runs):
    ours, theirs = runs.full("overdrive").checkpoints(), runs.full("accelerate").checkpoints()
    assert sorted(ours) == sorted(theirs) == [f"step_{n}" for n in range(1, 8 // runs.processes + 1)]
    for name, files in theirs.items():
        assert set(files) <= set(ours[name]), (name, files, ours[name])


@pytest.mark.parametrize("engine,written_by", [
    ("overdrive", "overdrive"),
    ("overdrive", "accelerate"),
    ("accelerate", "overdrive"),
])
def test_resumed_runs_end_as_accelerates_resumed_run(runs, engine, written_by):
    reference = runs.resumed("accelerate", "accelerate")
    resumed = runs.resumed(engine, written_by)
    assert_same_weights(resumed.weights("model.safetensors"), reference.weights("model.safetensors"), "model")
    results = reference.results()
    assert (results["starting_epoch"], results["resume_step"]) == (0, 4 // runs.processes)  # mid-epoch
    assert without(resumed.results(), "logged") == without(results, "logged")


def test_two_processes_resume_to_the_uninterrupted_run(runs):
    if runs.processes == 1:
        pytest.skip("on 1 process Accelerate's resumed run shuffles differently (the module's docstring)")
    resumed, full = runs.resumed("accelerate", "accelerate"), runs.full("accelerate")
    assert_same_weights(resumed.weights("model.safetensors"), full.weights("model.safetensors"), "model")


def test_what_the_script_logs_reads_as_under_accelerate(runs):
    assert runs.full("overdrive").results()["logged"] == runs.full("accelerate").results()["logged"]
