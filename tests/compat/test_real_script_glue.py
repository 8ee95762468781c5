"""tests/scripts/real/run_glue_no_trainer.py (transformers' text-classification example's shape: a tiny BERT
with dropout, ``step_N`` checkpoints, the documented mid-epoch resume with ``skip_first_batches``,
``gather_for_metrics``, ``save_model``) under the real Accelerate and under ``overdrive launch
--as_accelerate``, on 1 and 2 gloo CPU processes, the same seed: the final weights bit for bit, the evaluation,
the checkpoint folders' files, and resumes from either side's checkpoint.

A resumed run is compared with the real Accelerate's own resumed run, not with the uninterrupted one: on 1
process Accelerate leaves the shuffling to the global RNG (drawn again when the resumed epoch starts, after
``load_state``), and every epoch's iterator takes one draw from it, which moves the dropout masks.
"""

from __future__ import annotations

import pytest

from tests.support.real_scripts import Script, ScriptRuns, assert_same_weights, process_counts, without

pytestmark = [pytest.mark.requires("accelerate", "transformers"), pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.timeout(1500)]
# 32 samples in batches of 4 per process, accumulation 2: 4 // processes optimizer steps an epoch; the checkpoint
# is 2 batches into the second epoch
GLUE = Script("run_glue_no_trainer.py", ("--seed", "7", "--checkpointing_steps", "1"),
              checkpoint=lambda processes: f"step_{4 // processes + 1}",
              weights=("final/model.safetensors", "model.safetensors"))


@pytest.fixture(scope="module", params=process_counts(1), ids=lambda n: f"{n}proc")
def runs(request, tmp_path_factory) -> ScriptRuns:
    return ScriptRuns(tmp_path_factory.mktemp(f"glue_{request.param}"), GLUE, request.param)


def test_full_runs_end_with_the_same_weights_and_evaluation(runs):
    ours, theirs = runs.full("overdrive"), runs.full("accelerate")
    for name in GLUE.weights:
        assert_same_weights(ours.weights(name), theirs.weights(name), name)
    results = theirs.results()
    assert results["num_processes"] == runs.processes and results["completed_steps"] == 8 // runs.processes
    assert len(results["predictions"]) == 10  # gather_for_metrics dropped the last batch's repeats
    assert without(ours.results(), "logged") == without(results, "logged")


def test_checkpoint_folders_hold_the_same_files(runs):
    ours, theirs = runs.full("overdrive").checkpoints(), runs.full("accelerate").checkpoints()
    assert sorted(ours) == sorted(theirs) == [f"step_{n}" for n in range(1, 8 // runs.processes + 1)]
    for name, files in theirs.items():
        assert set(files) <= set(ours[name]), (name, files, ours[name])  # overdrive's own files may be extra


@pytest.mark.parametrize("engine,written_by", [
    ("overdrive", "overdrive"),
    ("overdrive", "accelerate"),
    ("accelerate", "overdrive"),
])
def test_resumed_runs_end_as_accelerates_resumed_run(runs, engine, written_by):
    reference = runs.resumed("accelerate", "accelerate")
    resumed = runs.resumed(engine, written_by)
    for name in GLUE.weights:
        assert_same_weights(resumed.weights(name), reference.weights(name), name)
    results = reference.results()
    assert (results["starting_epoch"], results["resume_step"]) == (1, 2)  # mid-epoch, batches skipped
    assert without(resumed.results(), "logged") == without(results, "logged")


def test_what_the_script_logs_reads_as_under_accelerate(runs):
    assert runs.full("overdrive").results()["logged"] == runs.full("accelerate").results()["logged"]
