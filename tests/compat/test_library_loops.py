"""Libraries' own loops on overdrive, compared with the same loops on the real Accelerate, on 1 and 2 processes:
a diffusers training loop in the shape of its train_unconditional.py example (EMA, save/load pre-hooks calling
save_pretrained / from_pretrained, save_state every 3 optimizer steps on the main process only (as the example does), resume with load_state and the example's own batch
skipping, DDPMPipeline from the unwrapped model), sentence-transformers' SentenceTransformerTrainer, setfit's
Trainer and lm-eval's HFLM. See tests/scripts/library_loops_run.py.

One process per engine and process count runs every job (a Python start with these libraries costs ~10 s of
CPU): four runs in all, shared by the tests through module fixtures; each fixture starts its two engines' runs
together. Shuffling is the libraries' own (the
example's ``shuffle=True`` DataLoader, sentence-transformers' seeded batch sampler).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import clean_env, run_at_once

NEEDED = ("accelerate", "transformers", "diffusers", "sentence_transformers", "setfit", "lm_eval", "datasets")
pytestmark = [pytest.mark.requires(*NEEDED)]
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "library_loops_run.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
JOBS = ("diffusers", "st", "setfit", "lmeval")


def _env(tmp_path: Path) -> dict[str, str]:
    env = clean_env(tmp_path, PYTHONPATH=SRC, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                    TRANSFORMERS_NO_ADVISORY_WARNINGS="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    return {k: v for k, v in env.items() if not k.startswith("ACCELERATE_")}


def command(tmp_path: Path, name: str, *jobs: str, processes: int, overdrive: bool,
            flags: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str], Path]:
    """Every job in one Python process per rank: plain python (1 process; ``--alias`` for overdrive), else
    ``overdrive launch --as_accelerate`` or torchrun (the real Accelerate); (argv, environment, folder)."""
    out = str(tmp_path / name)
    if processes == 1:
        argv = [sys.executable, SCRIPT, out, *jobs, *flags, *(["--alias"] if overdrive else [])]
    elif overdrive:
        argv = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                "--as_accelerate", SCRIPT, out, *jobs, *flags]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), SCRIPT, out,
                *jobs, *flags]
    return argv, _env(tmp_path), tmp_path


def results(tmp_path: Path, name: str, jobs: tuple[str, ...], proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-5000:])
    return {job: json.loads((tmp_path / name / job / "result.json").read_text()) for job in jobs}


def both(root: Path, processes: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """(ours, theirs): the two engines' runs, started together (tests/support/cli.py: run_at_once)."""
    ours, theirs = run_at_once(command(root, "ours", *JOBS, processes=processes, overdrive=True),
                               command(root, "theirs", *JOBS, processes=processes, overdrive=False), timeout=900)
    return results(root, "ours", JOBS, ours), results(root, "theirs", JOBS, theirs)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[dict[str, dict], dict[str, dict]]:
    """(ours, theirs): every job on one process."""
    return both(tmp_path_factory.mktemp("loops_1"), 1)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[dict[str, dict], dict[str, dict]]:
    """(ours, theirs): every job on two processes."""
    return both(tmp_path_factory.mktemp("loops_2"), 2)


def close(ours: list[float], theirs: list[float], tolerance: float) -> None:
    assert len(ours) == len(theirs) and ours, (ours, theirs)
    for a, b in zip(ours, theirs):
        assert math.isfinite(a) and abs(a - b) <= tolerance * max(1.0, abs(b)), (ours, theirs)


def pair(request, processes: int, job: str) -> tuple[dict, dict]:
    runs = request.getfixturevalue("one_process" if processes == 1 else "two_processes")
    ours, theirs = runs[0][job], runs[1][job]
    assert ours["library"] == "overdrive" and theirs["library"] == "accelerate"
    assert ours["num_processes"] == theirs["num_processes"] == processes
    return ours, theirs


#: fp32 on both sides; 2 processes average gradients over gloo in the same order
TOLERANCE = 1e-4
PROCESSES = [pytest.param(1, marks=pytest.mark.slow),
             pytest.param(2, marks=[pytest.mark.slow, pytest.mark.multiprocess])]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("processes", PROCESSES)
def test_diffusers_unconditional_example_loop_matches_accelerate(request, processes):
    ours, theirs = pair(request, processes, "diffusers")
    for part in ("first", "resumed"):
        mine, reference = ours[part], theirs[part]
        close(mine["losses"], reference["losses"], TOLERANCE)
        assert mine["skipped"] == reference["skipped"] and mine["global_step"] == reference["global_step"]
        assert mine["batches_per_epoch"] == reference["batches_per_epoch"]
        # the pre-hooks got the user's UNet2DModel (save_pretrained / register_to_config work on it)
        assert mine["hooks"] == reference["hooks"] and set(mine["hooks"]["saved"]) <= {"UNet2DModel"}
        assert abs(mine["ema_decay"] - reference["ema_decay"]) <= 1e-6
        for checkpoint in mine["checkpoints"]:
            assert {"unet", "unet_ema"} <= set(checkpoint), checkpoint
        assert len(mine["checkpoints"]) == len(reference["checkpoints"])
        image, reference_image = mine["image"], reference["image"]
        assert image["shape"] == reference_image["shape"] == [1, 8, 8, 3]
        assert image["pipeline_files"] == reference_image["pipeline_files"]
        close([image["mean"], image["std"]], [reference_image["mean"], reference_image["std"]], 1e-3)
    assert theirs["first"]["hooks"]["saved"] and theirs["resumed"]["hooks"]["loaded"] == ["UNet2DModel"]
    assert theirs["resumed"]["skipped"] > 0  # resumed mid-epoch: the example's own skipping ran


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("processes", PROCESSES)
def test_sentence_transformers_trainer_matches_accelerate(request, processes):
    ours, theirs = pair(request, processes, "st")
    assert ours["steps"] == theirs["steps"] > 0
    close(ours["losses"], theirs["losses"], TOLERANCE)
    close(ours["embedding"], theirs["embedding"], TOLERANCE)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("processes", PROCESSES)
def test_setfit_trainer_matches_accelerate(request, processes):
    ours, theirs = pair(request, processes, "setfit")
    close(ours["losses"], theirs["losses"], TOLERANCE)
    close(ours["probabilities"], theirs["probabilities"], 1e-3)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("processes", PROCESSES)
def test_lm_eval_hflm_matches_accelerate(request, processes):
    """lm-eval builds its own Accelerator; its data-parallel split needs ``torch.cuda.device_count() > 1``, so
    on CPUs each process scores every request (world size 1 under both engines)."""
    ours, theirs = pair(request, processes, "lmeval")
    assert (ours["rank"], ours["world_size"]) == (theirs["rank"], theirs["world_size"]) == (0, 1)
    assert ours["has_accelerator"] == theirs["has_accelerator"] == (processes > 1)
    close(ours["scores"], theirs["scores"], TOLERANCE)

