"""Run the same code once under the real Accelerate and once under overdrive's alias, each in a fresh process,
so that a test can compare the two.

- ``run_function(fn, engine, *args)``: ``fn(engine, *args)`` in a new ``python`` process (no launcher or cluster
  variables, so Accelerate sees a plain single-process run); ``fn`` is a module-level function of a test module
  that installs the alias itself when ``engine == "overdrive"`` and imports ``accelerate`` after that. Its
  return value comes back (pickled).
- ``run_script(script, folder, processes, overdrive)``: a script of tests/scripts/ on 1 or more processes
  (overdrive: ``--alias`` on one, ``overdrive launch --as_accelerate`` on several; Accelerate: plain python
  or torchrun), each rank writing ``<folder>/<engine>/result_<rank>.json``; the results in rank order.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.cli import clean_env

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")
ENGINES = ("accelerate", "overdrive")
_CHILD = """
import importlib.util, pickle, sys
path, name, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location(name.split(".")[0] + "_engine_child", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, name)
args = pickle.load(sys.stdin.buffer)
with open(out, "wb") as f:
    pickle.dump(fn(*args), f)
"""


def engine_env(folder: Path | str, **extra: str) -> dict[str, str]:
    """The tests' clean environment (no launcher's, cluster's, overdrive's or Accelerate's variables; config
    files under ``folder``) with the repository and ``src`` importable."""
    return clean_env(Path(folder), PYTHONPATH=os.pathsep.join((str(ROOT), SRC)), **extra)


def run_function(fn: Callable[..., Any], engine: str, *args: Any, timeout: float = 240) -> Any:
    """``fn(engine, *args)`` in a fresh Python process; its return value."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.pickle"
        proc = subprocess.run([sys.executable, "-c", _CHILD, inspect.getfile(fn), fn.__qualname__, str(out)],
                              input=pickle.dumps((engine, *args)), capture_output=True, timeout=timeout,
                              env=engine_env(folder), cwd=folder)
        assert proc.returncode == 0, f"{engine}: {proc.stderr.decode(errors='replace')[-4000:]}"
        return pickle.loads(out.read_bytes())


def run_script(script: str | Path, folder: Path, processes: int, overdrive: bool,
               timeout: float = 300) -> list[dict]:
    """Each rank's result of ``script`` on ``processes`` processes under overdrive or the real Accelerate;
    every result's ``library`` names the engine that ran it (checked, then removed)."""
    engine = "overdrive" if overdrive else "accelerate"
    out = folder / engine
    env = engine_env(folder)
    if processes == 1:
        command = [sys.executable, str(script), str(out), *(["--alias"] if overdrive else [])]
    elif overdrive:
        command = [sys.executable, "-m", "overdrive.cli", "launch", "--num_processes", str(processes),
                   "--as_accelerate", str(script), str(out)]
    else:  # Accelerate runs several CPU processes only when told to use the CPU
        env["ACCELERATE_USE_CPU"] = "true"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), str(script),
                   str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=folder)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    results = [json.loads((out / f"result_{rank}.json").read_text()) for rank in range(processes)]
    assert [r.pop("library") for r in results] == [engine] * processes
    return results
