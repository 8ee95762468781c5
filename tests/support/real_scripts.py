"""Launching the training scripts of tests/scripts/real/ (shaped like the examples people run with Accelerate)
as a user would, under the real Accelerate and under overdrive, and reading what they leave behind.

The real side: ``python SCRIPT`` on 1 process; on more, ``torchrun --standalone`` with
``ACCELERATE_USE_CPU=true`` (Accelerate's ``launch --cpu`` starts one process, or hands to mpirun). overdrive's side: ``overdrive launch --num_processes N --as_accelerate SCRIPT``, so that
the script's own ``import accelerate`` gets overdrive. Every run writes into its own ``--output_dir``; a
resumed run starts from a copy of a checkpoint folder of a full run (the state a run stopped there leaves),
copied into its own output folder, in a new launch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cli import clean_env, run_at_once

REAL = Path(__file__).resolve().parents[1] / "scripts" / "real"  # tests/scripts/real
SRC = str(Path(__file__).resolve().parents[2] / "src")
ENGINES = ("accelerate", "overdrive")


def process_counts(default: int) -> list[int]:
    """The numbers of processes a script's tests run on: ``default`` alone in the default suite (each count costs
    about six launches of each engine), 1 and 2 with ``OVERDRIVE_TEST_REAL_SCRIPTS=all``."""
    return [1, 2] if os.environ.get("OVERDRIVE_TEST_REAL_SCRIPTS") == "all" else [default]


@dataclass(frozen=True)
class Script:
    """A script of tests/scripts/real, the arguments of every run, and the checkpoint a resumed run starts
    from (a function of the number of processes: the steps per epoch change with it)."""

    name: str
    args: tuple[str, ...]
    checkpoint: Any  # Callable[[int], str]
    weights: tuple[str, ...] = ("model.safetensors",)


@dataclass
class Launch:
    """One finished launch: its command's outcome and its output folder."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    output_dir: Path

    def check(self) -> None:
        assert self.returncode == 0, (" ".join(self.command), self.stdout[-2000:], self.stderr[-4000:])

    def results(self) -> dict[str, Any]:
        self.check()
        return json.loads((self.output_dir / "all_results.json").read_text())

    def weights(self, name: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        self.check()
        return load_file(str(self.output_dir / name))

    def checkpoints(self) -> dict[str, list[str]]:
        """Each checkpoint folder's files (paths relative to the folder), by folder name."""
        self.check()
        folders = [p for p in self.output_dir.iterdir() if p.is_dir() and p.name.startswith(("step_", "epoch_",
                                                                                               "checkpoint-"))]
        return {folder.name: sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
                for folder in folders}


def command(engine: str, script: str, processes: int, output_dir: Path, *args: str
            ) -> tuple[list[str], dict[str, str], Path]:
    """The command that runs ``script`` to its end under ``engine`` on ``processes`` CPU processes (gloo):
    (argv, environment, working folder)."""
    path = str(REAL / script)
    if engine == "overdrive":
        argv = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                "--as_accelerate", path]
    elif processes == 1:
        argv = [sys.executable, path]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                path]
    argv += ["--output_dir", str(output_dir), *args]
    env = clean_env(output_dir.parent, PYTHONPATH=SRC, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
                    TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TOKENIZERS_PARALLELISM="false")
    if engine == "accelerate" and processes > 1:
        # what `accelerate launch --cpu` sets: without it Accelerate makes each torchrun rank a one-process run
        env["ACCELERATE_USE_CPU"] = "true"
    return argv, env, output_dir.parent


def launch_together(*runs: tuple[str, str, int, Path, tuple[str, ...]]) -> list[Launch]:
    """Each ``(engine, script, processes, output_dir, args)`` run to its end, all started together
    (tests/support/cli.py: run_at_once: a Python start with transformers is seconds of one core)."""
    commands = [command(engine, script, processes, output_dir, *args)
                for engine, script, processes, output_dir, args in runs]
    done = run_at_once(*commands, timeout=420)
    return [Launch(argv, proc.returncode, proc.stdout, proc.stderr, run[3])
            for (argv, _, _), proc, run in zip(commands, done, runs)]


@dataclass
class ScriptRuns:
    """Every launch of one script on one process count, each started once, when a test first asks for it;
    the launches that do not depend on each other start together (both engines' full runs; a resumed run and
    the real Accelerate's resumed run it is compared with)."""

    root: Path
    script: Script
    processes: int
    _done: dict[tuple[str, ...], Launch] = field(default_factory=dict)

    def _run(self, wanted: dict[tuple[str, ...], tuple[Path, tuple[str, ...]]]) -> None:
        """Launch the ``wanted`` runs not done yet ({key: (output folder, arguments)}), together."""
        missing = [key for key in wanted if key not in self._done]
        launches = launch_together(*((key[1], self.script.name, self.processes, wanted[key][0], wanted[key][1])
                                     for key in missing))
        self._done.update(zip(missing, launches))

    def full(self, engine: str) -> Launch:
        """A run from the start to the end, writing its checkpoints (both engines' start together)."""
        if ("full", engine) not in self._done:
            self._run({("full", name): (self.root / f"full_{name}", self.script.args) for name in ENGINES})
        return self._done[("full", engine)]

    def resumed(self, engine: str, written_by: str) -> Launch:
        """A new run under ``engine`` resumed from the checkpoint that ``written_by``'s full run wrote (started
        together with the real Accelerate's resumed run from its own checkpoint, every test's reference)."""
        wanted = {}
        for key in (("resumed", engine, written_by), ("resumed", "accelerate", "accelerate")):
            if key in self._done or key in wanted:
                continue
            name = self.script.checkpoint(self.processes)
            output_dir = self.root / f"resumed_{key[1]}_from_{key[2]}"
            source = self.full(key[2])
            source.check()
            shutil.copytree(source.output_dir / name, output_dir / name)
            wanted[key] = (output_dir, (*self.script.args, "--resume_from_checkpoint", str(output_dir / name)))
        self._run(wanted)
        return self._done[("resumed", engine, written_by)]


def assert_same_weights(ours: dict[str, Any], theirs: dict[str, Any], what: str) -> None:
    """Bit for bit: the same names, and every tensor equal (dtype, shape and values)."""
    import torch

    assert sorted(ours) == sorted(theirs), (what, sorted(set(ours) ^ set(theirs)))
    differ: dict[str, str] = {}
    for name, mine in ours.items():
        reference = theirs[name]
        if (mine.dtype, mine.shape) != (reference.dtype, reference.shape):
            differ[name] = f"{mine.dtype} {list(mine.shape)} against {reference.dtype} {list(reference.shape)}"
        elif not torch.equal(mine, reference):
            differ[name] = f"off by up to {float((mine.double() - reference.double()).abs().max()):.3g}"
    assert not differ, (what, differ)


def without(results: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in results.items() if k not in keys}
