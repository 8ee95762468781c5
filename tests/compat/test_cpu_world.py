"""Two processes on a machine without a GPU, started with and without the CPU setting, under the real Accelerate
and under overdrive: what each process's state says (distributed type, number of processes, index).

Accelerate joins CPU processes as ``MULTI_CPU`` only with the CPU setting (``ACCELERATE_USE_CPU``, which
``accelerate launch --cpu`` sets, or ``Accelerator(cpu=True)``); without it (``torchrun``, or ``accelerate launch
--multi_gpu`` on such a machine) each process is ``NO``, alone. overdrive gives the same; ``overdrive launch
--num_processes 2`` on such a machine sets the CPU setting itself, so its processes join.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import clean_env

pytestmark = [pytest.mark.requires("accelerate"),
              pytest.mark.skipif(torch.accelerator.is_available(), reason="a machine without a GPU is the case")]
SRC = str(Path(__file__).resolve().parents[2] / "src")

# each engine named in argv builds its Accelerator and records its state and the torch.distributed world size
# (None: no process group); overdrive first: without the CPU setting it makes no process group, with it the
# real Accelerate's state keeps the group overdrive made
PROBE = """
import json, os, sys
import torch.distributed as dist
out, engines = sys.argv[1], sys.argv[2:]
seen = {}
for engine in engines:
    if engine == "accelerate":
        from accelerate import Accelerator
    else:
        from overdrive import Accelerator
    state = Accelerator().state
    group = dist.get_world_size() if dist.is_initialized() else None
    seen[engine] = [str(state.distributed_type).split(".")[-1], state.num_processes, state.process_index, group]
with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
"""


def _states(folder: Path, launcher: list[str], *engines: str, **env: str) -> tuple[list[dict], str]:
    """Each process's recorded states, in the order of torchrun's RANK, and the launch's stderr."""
    probe, out = folder / "probe.py", folder / "out"
    out.mkdir(parents=True)
    probe.write_text(PROBE)
    result = subprocess.run([sys.executable, "-m", *launcher, str(probe), str(out), *engines],
                            env=clean_env(folder, PYTHONPATH=SRC, **env), cwd=folder, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)], result.stderr


def test_torchrun_without_the_cpu_setting_gives_each_process_alone_as_accelerate(tmp_path):
    states, stderr = _states(tmp_path, ["torch.distributed.run", "--nproc-per-node", "2"], "overdrive", "accelerate")
    # Accelerate 1.16.0, measured here: its state says one process, yet it makes a gloo group of both (its
    # init_process_group without a backend); overdrive makes none
    assert [s["accelerate"] for s in states] == [["NO", 1, 0, 2], ["NO", 1, 0, 2]]
    assert [s["overdrive"] for s in states] == [["NO", 1, 0, None], ["NO", 1, 0, None]]
    # one warning (rank 0's) names the setting that joins them
    assert stderr.count("each trains alone (world size 1)") == 1 and "ACCELERATE_USE_CPU=1" in stderr, stderr


@pytest.mark.slow
def test_torchrun_with_the_cpu_setting_joins_the_processes_as_accelerate(tmp_path):
    states, stderr = _states(tmp_path, ["torch.distributed.run", "--nproc-per-node", "2"], "overdrive", "accelerate",
                             ACCELERATE_USE_CPU="true")
    assert [s["accelerate"] for s in states] == [["MULTI_CPU", 2, 0, 2], ["MULTI_CPU", 2, 1, 2]]
    assert [s["overdrive"] for s in states] == [s["accelerate"] for s in states]
    assert "trains alone" not in stderr


@pytest.mark.slow
def test_the_launchers_multi_gpu_on_a_machine_without_one_as_accelerate_and_overdrive_launch_joins(tmp_path):
    """``--multi_gpu`` on this machine: each process alone under both launchers (overdrive's says so and names
    --cpu); ``overdrive launch --num_processes 2`` means CPU processes and joins them."""
    theirs, _ = _states(tmp_path / "a", ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"],
                        "accelerate")
    ours, stderr = _states(tmp_path / "b", ["overdrive.cli", "launch", "--multi_gpu", "--num_processes", "2"],
                           "overdrive")
    assert [s["accelerate"][:3] for s in theirs] == [["NO", 1, 0], ["NO", 1, 0]]
    assert [s["overdrive"][:3] for s in ours] == [s["accelerate"][:3] for s in theirs]
    lines = [line for line in stderr.splitlines() if "alone" in line]
    assert len(lines) == 1 and "each training alone (world size 1)" in lines[0] and "add --cpu" in lines[0], stderr
    joined, stderr = _states(tmp_path / "c", ["overdrive.cli", "launch", "--num_processes", "2"], "overdrive")
    assert [s["overdrive"] for s in joined] == [["MULTI_CPU", 2, 0, 2], ["MULTI_CPU", 2, 1, 2]]
    assert "alone" not in stderr
