"""Run the same code once under the real Accelerate and once under overdrive's alias, each in a fresh process,
so that a test can compare the two.

- ``run_function(fn, engine, *args)``: ``fn(engine, *args)`` in a new process (forked from the tests' fork
  server, which imported torch once: tests/support/distributed.py), with no launcher or cluster variables, so
  Accelerate sees a plain single-process run; ``fn`` is a module-level function of a test module that installs
  the alias itself when ``engine == "overdrive"`` and imports ``accelerate`` after that. Its return value comes
  back (pickled).
- ``run_script(script, folder, processes, overdrive)``: a script of tests/scripts/ on 1 or more processes
  (overdrive: ``--alias`` on one, ``overdrive launch --as_accelerate`` on several; Accelerate: plain python
  or torchrun), each rank writing ``<folder>/<engine>/result_<rank>.json``; the results in rank order.
  ``run_script_both``: both engines' runs of it, started together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.cli import clean_env, run_at_once
from tests.support.distributed import run_distributed

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")
ENGINES = ("accelerate", "overdrive")


def engine_env(folder: Path | str, **extra: str) -> dict[str, str]:
    """The tests' clean environment (no launcher's, cluster's, overdrive's or Accelerate's variables; config
    files under ``folder``) with the repository and ``src`` importable."""
    return clean_env(Path(folder), PYTHONPATH=os.pathsep.join((str(ROOT), SRC)), **extra)


def _in_folder(fn: Callable[..., Any], env: dict[str, str], folder: str, *args: Any) -> Any:
    """``fn(*args)`` with exactly ``env`` (not the rank variables run_distributed adds) in ``folder``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(folder)
    return fn(*args)


def run_function(fn: Callable[..., Any], engine: str, *args: Any, timeout: float = 240) -> Any:
    """``fn(engine, *args)`` in a new process; its return value."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    with tempfile.TemporaryDirectory() as folder:
        try:
            return run_distributed(_in_folder, 1, fn, engine_env(folder), folder, engine, *args, timeout=timeout)[0]
        except (AssertionError, TimeoutError) as error:
            raise AssertionError(f"{engine}: {error}") from error


def _script_command(script: str | Path, folder: Path, processes: int, overdrive: bool
                    ) -> tuple[list[str], dict[str, str], Path]:
    out = folder / ("overdrive" if overdrive else "accelerate")
    env = engine_env(folder)
    if processes == 1:
        command = [sys.executable, str(script), str(out), *(["--alias"] if overdrive else [])]
    elif overdrive:
        command = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                   "--as_accelerate", str(script), str(out)]
    else:  # Accelerate runs several CPU processes only when told to use the CPU
        env["ACCELERATE_USE_CPU"] = "true"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), str(script),
                   str(out)]
    return command, env, folder


def _script_results(proc: subprocess.CompletedProcess, folder: Path, processes: int, overdrive: bool) -> list[dict]:
    engine = "overdrive" if overdrive else "accelerate"
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    results = [json.loads((folder / engine / f"result_{rank}.json").read_text()) for rank in range(processes)]
    assert [r.pop("library") for r in results] == [engine] * processes
    return results


def run_script(script: str | Path, folder: Path, processes: int, overdrive: bool,
               timeout: float = 300) -> list[dict]:
    """Each rank's result of ``script`` on ``processes`` processes under overdrive or the real Accelerate;
    every result's ``library`` names the engine that ran it (checked, then removed)."""
    command, env, cwd = _script_command(script, folder, processes, overdrive)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    return _script_results(proc, folder, processes, overdrive)


def run_script_both(script: str | Path, folder: Path, processes: int,
                    timeout: float = 300) -> tuple[list[dict], list[dict]]:
    """``run_script`` under both engines, started together (tests/support/cli.py: run_at_once): (overdrive's
    results, the real Accelerate's)."""
    ours, theirs = run_at_once(_script_command(script, folder, processes, True),
                               _script_command(script, folder, processes, False), timeout=timeout)
    return (_script_results(ours, folder, processes, True), _script_results(theirs, folder, processes, False))
