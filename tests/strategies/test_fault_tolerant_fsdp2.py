"""Fault-tolerant HSDP through torchft (``--ft_lighthouse`` with ``--use_fsdp --fsdp_version 2``): each replica
group shards the model with FSDP2 over its own two processes, the groups average the gradient shards through
torchft. The unchanged script tests/scripts/ft_job.py, launched as in tests/strategies/test_fault_tolerant.py
(whose helpers these tests reuse), a real lighthouse on 127.0.0.1.

- no fault: two groups of two processes equal plain DDP over the same four processes, ``save_state`` /
  ``load_state`` give the sharded state back, and the state a healing group receives is each process's shards
  even when read while the weights are gathered (as torchft's quorum thread may, during a forward);
- one group killed mid-run (every process of its launch, SIGKILL): the other keeps its processes and steps again;
  the killed group launched again heals, each process from the live group's process of the same shard rank, and
  both end with the same weights and optimizer state.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("torchft", reason="fault-tolerant training needs torchft (pip install 'overdrive[ft]')")
from tests.strategies.test_fault_tolerant import (  # noqa: E402  (after the skip: torchft is optional)
    _address,
    _env,
    _final,
    _flat_optimizer,
    _kill_group_1_and_relaunch,
    _launch,
    _lighthouse,
    _logs,
    _plain_ddp,
    _steps,
    _wait,
)

pytestmark = pytest.mark.multiprocess
FSDP2 = ("--use_fsdp", "--fsdp_version", "2")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_faults_two_sharded_groups_equal_plain_ddp_and_checkpoints_load(tmp_path):
    """Two groups of two processes, FSDP2 inside each (the lighthouse waits for both), train as DDP over the same
    four processes does (1e-6, the tolerance of FSDP2 against DDP); the run ends with ``save_state``, its
    weights and optimizer state zeroed and ``load_state``, so what it saves last is what the checkpoint gave
    back."""
    server = _lighthouse(min_replicas=2)
    out = tmp_path / "ft"
    out.mkdir()
    env = _env(tmp_path, SAMPLES="64", SAVE_AND_LOAD="1")
    try:
        procs = [_launch(tmp_path, out, g, _address(server), env, 2, *FSDP2) for g in (0, 1)]
        _wait(procs, 240, out)
    finally:
        server.shutdown()
    assert [p.returncode for p in procs] == [0, 0], _logs(out)
    ddp = _plain_ddp(64, processes=4)
    assert len(_steps(out, 0)) == 4 and len(_steps(out, 1)) == 4  # 64 samples, 4 x 4 a step
    for group in (0, 1):
        final = _final(out, group)
        assert final["distributed_type"] == "DistributedType.FSDP"
        for name, reference in ddp["weights"].items():
            torch.testing.assert_close(final["weights"][name], reference, rtol=0, atol=1e-6)
        torch.testing.assert_close(_flat_optimizer(final["optimizer"]), _flat_optimizer(ddp["optimizer"]),
                                   rtol=0, atol=1e-6)
        assert final["scheduler"] == ddp["scheduler"]
        for rank in (0, 1):  # read while the weights were gathered: the shards sent, the gathered ones kept
            sent = json.loads((out / f"sent_{group}_{rank}.json").read_text())
            assert set(sent["sent"].values()) == {"DTensor"} and "DTensor" not in sent["in_use"].values(), sent
        saved = out / f"saved_state_{group}"  # FSDP's sharded layout, as Accelerate writes it
        assert (saved / "pytorch_model_fsdp_0").is_dir() and (saved / "optimizer_0").is_dir(), sorted(saved.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_sharded_group_drops_out_and_heals_shard_by_shard(tmp_path):
    """Group 1 (two processes) killed outright in its 8th step, after its forward: group 0 drops that step, goes
    on with the same processes and steps again within 30 s; group 1 launched again heals from group 0 (each
    process its own shard of the weights and optimizer state, over the network, no checkpoint) and both end
    equal, 8 scheduler steps after the healed group's first step."""
    server = _lighthouse(min_replicas=1)
    out = tmp_path / "out"
    out.mkdir()
    env = _env(tmp_path, SAMPLES="4000", STEP_SLEEP="0.25")
    procs, killed_at, end = _kill_group_1_and_relaunch(tmp_path, out, server, env, 2, *FSDP2, start_s=150)
    assert procs[0].returncode == 0 and procs[2].returncode == 0, _logs(out)
    survivor, healed = _steps(out, 0), _steps(out, 1)
    assert {s["pid"] for s in survivor} == {survivor[0]["pid"]}  # never restarted
    after = [s["time"] for s in survivor if s["time"] > killed_at and not s["skipped"]]
    assert after and after[0] - killed_at < 30, f"the survivor's next step came {after[0] - killed_at:.1f} s later"
    print(f"FSDP2 groups: the survivor stepped again {after[0] - killed_at:.2f} s after the kill")  # docs quote it (-s)
    assert sum(s["skipped"] for s in survivor) == 1  # the step the loss happened in is dropped, only it
    survivor_err, healed_err = (out / "group0.err").read_text(), (out / "group1.err").read_text()
    assert "replica group 1 (machine" in survivor_err and "was lost; the quorum is now 1 group(s)" in survivor_err
    healed_lines = re.findall(r"healed from replica group 0 \(machine [^)\s]+\) in (\d+\.\d\d) s", healed_err)
    assert len(healed_lines) == 1 and float(healed_lines[0]) < 30, healed_err
    print(f"FSDP2 groups: healed in {healed_lines[0]} s")  # docs/machines.md quotes it (-s)
    assert 0 < len(healed) < len(survivor) and healed[-1]["scheduler_step"] == survivor[-1]["scheduler_step"] >= end
    assert len((out / "steps_1_1.jsonl").read_text().splitlines()) == len(healed)  # both processes stepped
    first, second = _final(out, 0), _final(out, 1)
    assert first["distributed_type"] == second["distributed_type"] == "DistributedType.FSDP"
    for name, weight in first["weights"].items():  # a shard received from the wrong rank would differ here
        torch.testing.assert_close(second["weights"][name], weight, rtol=0, atol=0)
    torch.testing.assert_close(_flat_optimizer(second["optimizer"]), _flat_optimizer(first["optimizer"]),
                               rtol=0, atol=0)
    assert second["scheduler"] == first["scheduler"]
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("saved_state*"))
