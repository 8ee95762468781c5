"""transformers' Trainer, PEFT and TRL running on overdrive (through install_as_accelerate() and
``overdrive launch --as_accelerate``), compared with the same runs on the real Accelerate.

Tiny BERT classifier and Llama causal LM built from configs (no downloads), shuffling off, gradient
accumulation 2, a checkpoint half way, evaluate, predict (7 rows: uneven over 2 ranks), save, and a second
Trainer resumed from the half-way checkpoint. See tests/scripts/hf_trainer_run.py.

Runs that several tests compare with (the one-process fp32 runs, the two-process bf16 runs of both engines)
are module fixtures, and one process runs several models one after the other: each Python start with
transformers costs ~8 s of CPU, more than the training itself. The runs a comparison needs start together
(tests/support/cli.py: run_at_once).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.cli import clean_env, run_at_once

pytestmark = pytest.mark.requires("transformers", "accelerate")
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "hf_trainer_run.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(tmp_path: Path) -> dict[str, str]:
    env = clean_env(tmp_path, PYTHONPATH=SRC, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                    TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    return {k: v for k, v in env.items() if not k.startswith("ACCELERATE_")}


def _results(out: Path, jobs: tuple[str, ...], proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return {job: json.loads((out / job / "result.json").read_text()) for job in jobs}


class Run(NamedTuple):
    """One command of the script: what it runs, where it writes and which jobs it runs."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    out: Path
    jobs: tuple[str, ...]


def one(tmp_path: Path, name: str, *jobs: str, flags: tuple[str, ...] = ()) -> Run:
    """One process: plain python (the real Accelerate unless --alias) running ``jobs`` one after the other."""
    out = tmp_path / name
    return Run([sys.executable, SCRIPT, str(out), *jobs, *flags], _env(tmp_path), tmp_path, out, jobs)


def two(tmp_path: Path, name: str, *jobs: str, flags: tuple[str, ...] = (), overdrive: bool, processes: int = 2,
        as_accelerate: bool = True) -> Run:
    """``processes`` processes: ``overdrive launch`` (``--as_accelerate``, or the script's own alias call with
    ``--alias``) or torchrun with the real Accelerate."""
    out = tmp_path / name
    if overdrive:
        argv = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                *(["--as_accelerate"] if as_accelerate else []),
                *(["--mixed_precision", "bf16"] if "--bf16" in flags else []), SCRIPT, str(out), *jobs, *flags]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), SCRIPT,
                str(out), *jobs, *flags]
    return Run(argv, _env(tmp_path), tmp_path, out, jobs)


def together(*runs: Run) -> list[dict[str, dict]]:
    """The runs started together (tests/support/cli.py: run_at_once: each Python start with transformers is
    seconds of one core); each one's results, in order."""
    done = run_at_once(*((run.argv, run.env, run.cwd) for run in runs),
                       timeout=420 + 60 * max(len(run.jobs) for run in runs))
    return [_results(run.out, run.jobs, proc) for run, proc in zip(runs, done)]


def _has_peft_and_trl() -> bool:
    return importlib.util.find_spec("peft") is not None and importlib.util.find_spec("trl") is not None


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[dict[str, dict], dict[str, dict]]:
    """The fp32 one-process runs, ours (the alias) and the real Accelerate's, started together: BERT and Llama
    in one process each (a Python start with transformers costs ~8 s of CPU), and on ours LoRA and SFT after
    them."""
    root = tmp_path_factory.mktemp("one_process")
    extra = ("lora", "sft") if _has_peft_and_trl() else ()
    ours, theirs = together(one(root, "ours", "bert", "llama", *extra, flags=("--alias",)),
                            one(root, "theirs", "bert", "llama"))
    return ours, theirs


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[dict[str, dict], dict[str, dict]]:
    """(ours, theirs) on 2 processes in bf16, BERT and Llama in one launch each, started together: overdrive
    through ``overdrive launch`` whose script calls ``install_as_accelerate()`` itself (``--as_accelerate`` on 2
    processes: the Trainers of test_library_loops.py and the scripts of test_real_script_unconditional.py), the
    real Accelerate through torchrun."""
    root = tmp_path_factory.mktemp("two_processes")
    ours, theirs = together(two(root, "ours", "bert", "llama", flags=("--bf16", "--alias"), overdrive=True,
                                as_accelerate=False),
                            two(root, "theirs", "bert", "llama", flags=("--bf16",), overdrive=False))
    return ours, theirs


def assert_close(ours: list[float], theirs: list[float], tolerance: float) -> None:
    assert len(ours) == len(theirs) and ours, (ours, theirs)
    for a, b in zip(ours, theirs):
        assert math.isfinite(a) and abs(a - b) <= tolerance * max(1.0, abs(b)), (ours, theirs)


def check_run(run: dict, eval_rows: int = 7) -> None:
    assert run["library"] == "overdrive"
    assert run["predicted_rows"] == eval_rows == run["eval_rows"]
    assert {"config.json", "model.safetensors"} <= set(run["saved"])
    # the resumed Trainer reproduces the second half of the uninterrupted run
    assert_close(run["resumed_losses"][3:], run["losses"][3:], 1e-4)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test of the module runs the fixture's two processes (6 Trainer jobs)
@pytest.mark.parametrize("model", ["bert", "llama"])
def test_trainer_one_process_matches_accelerate(one_process, model):
    ours, theirs = one_process[0][model], one_process[1][model]
    assert theirs["library"] == "accelerate"
    check_run(ours)
    assert_close(ours["losses"], theirs["losses"], 1e-4)
    assert abs(ours["eval_loss"] - theirs["eval_loss"]) <= 1e-4


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_bert_trainer_under_deepspeed_zero2_matches_the_run_without_it(tmp_path, one_process):
    """Trainer(args.deepspeed=ZeRO-2 config) on overdrive trains, checkpoints (the Trainer pickles its
    arguments, which hold the state), evaluates and resumes like the same run without DeepSpeed (the one
    ``test_trainer_one_process_matches_accelerate`` compares with the real Accelerate); the real Accelerate gives
    the two runs the same losses too (measured; its DeepSpeed run is too slow for CI)."""
    ours = together(one(tmp_path, "zero2", "bert", flags=("--alias", "--deepspeed", "2")))[0]["bert"]
    plain = one_process[0]["bert"]
    assert ours["distributed_type"].endswith("DEEPSPEED") and not plain["distributed_type"].endswith("DEEPSPEED")
    check_run(ours)
    assert_close(ours["losses"], plain["losses"], 1e-4)
    assert abs(ours["eval_loss"] - plain["eval_loss"]) <= 1e-4


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_llama_trainer_two_processes_bf16_through_launch_matches_accelerate(two_processes):
    """Llama in bf16 on 2 processes of ``overdrive launch`` (the launch BERT's test below shares) against the
    real Accelerate's."""
    ours, theirs = two_processes[0]["llama"], two_processes[1]["llama"]
    assert theirs["library"] == "accelerate" and theirs["num_processes"] == 2
    assert ours["num_processes"] == 2 and ours["mixed_precision"] == "bf16"
    check_run(ours)
    assert_close(ours["losses"], theirs["losses"], 2e-2)  # bf16 autocast on both sides


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_bert_bf16_one_process_as_accelerate_and_two_processes_with_the_alias_call(tmp_path, two_processes):
    """BERT in bf16: 1 process through ``overdrive launch --as_accelerate``, and 2 processes through
    ``overdrive launch`` whose script calls ``install_as_accelerate()`` itself; each against the real Accelerate."""
    ones = together(two(tmp_path, "one", "bert", flags=("--bf16",), overdrive=True, processes=1),
                    one(tmp_path, "one_ref", "bert", flags=("--bf16",)))
    one_run, one_ref = ones[0]["bert"], ones[1]["bert"]
    assert one_run["num_processes"] == 1 and one_run["mixed_precision"] == "bf16" and one_ref["library"] == "accelerate"
    check_run(one_run)
    assert_close(one_run["losses"], one_ref["losses"], 2e-2)
    two_run, two_ref = two_processes[0]["bert"], two_processes[1]["bert"]
    assert two_run["num_processes"] == 2 and two_run["mixed_precision"] == "bf16" and two_ref["num_processes"] == 2
    check_run(two_run)
    assert_close(two_run["losses"], two_ref["losses"], 2e-2)
    assert abs(two_run["eval_loss"] - two_ref["eval_loss"]) <= 2e-2 * max(1.0, abs(two_ref["eval_loss"]))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.requires("peft", "trl")
def test_peft_lora_changes_only_adapters_and_trl_sft_trains(one_process):
    lora = one_process[0]["lora"]
    assert lora["changed"] and all("lora_" in name or "classifier" in name for name in lora["changed"]), lora["changed"]
    assert any("lora_" in name for name in lora["changed"])
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(lora["saved"])
    sft = one_process[0]["sft"]
    assert sft["library"] == "overdrive" and len(sft["sft_losses"]) == 3
    assert all(math.isfinite(loss) for loss in sft["sft_losses"])


def test_trainer_script_refuses_the_alias_after_the_real_accelerate(tmp_path):
    code = ("import accelerate, overdrive\n"
            "try:\n    overdrive.install_as_accelerate()\nexcept overdrive.compat.alias.AccelerateAliasError as e:\n"
            "    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(tmp_path), cwd=os.fspath(tmp_path))
    assert proc.returncode == 0 and "REFUSED" in proc.stdout and "already imported" in proc.stdout
