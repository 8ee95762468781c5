"""runtime.group, the one source of rank and world size: before the process group exists the launcher's
variables decide (torchrun, SLURM, MPI), so ``set_seed(device_specific=True)`` differs per process."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from overdrive.runtime import group

_SCRIPT = """
import json, os, sys
import torch
from overdrive.runtime import group
from overdrive.helpers.random import set_seed
out = {}
for name, env in json.loads(sys.argv[1]).items():
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        os.environ.pop(key, None)
    os.environ.update(env)
    set_seed(5, device_specific=True)
    out[name] = [group.process_rank(), torch.rand(2).tolist(), group.is_initialized()]
print(json.dumps(out))
"""


def test_set_seed_device_specific_uses_the_launchers_rank_before_any_process_group():
    cases = {"slurm": {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
             "open_mpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"},
             "pmi": {"PMI_RANK": "2", "PMI_SIZE": "3"},
             "torchrun": {"RANK": "1", "WORLD_SIZE": "2"},
             "alone": {}}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    expected_rank = {"slurm": 1, "open_mpi": 3, "pmi": 2, "torchrun": 1, "alone": 0}
    for name, (rank, draws, initialized) in found.items():
        assert rank == expected_rank[name] and not initialized, name
        torch.manual_seed(5 + rank)
        assert draws == torch.rand(2).tolist(), name


def test_one_process_sees_rank_0_of_1():
    # (another test may have made a one-process group here: the answers are the same either way)
    assert (group.rank(), group.world_size(), group.is_distributed()) == (0, 1, False)
    assert (group.default_group() is None) == (not group.is_initialized())
