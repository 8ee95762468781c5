"""Fault-tolerant training through torchft (``--ft_lighthouse``): replica groups launched separately on
127.0.0.1, each ``overdrive launch`` of the unchanged script tests/scripts/ft_job.py, a real lighthouse.

- no fault: two groups of two processes equal plain DDP over the same four processes (computed here as plain
  PyTorch on each step's global batch, which is what DDP computes up to the order of float sums);
- one group killed mid-run (every process of its launch, SIGKILL): the other keeps its processes, steps again
  within 30 s and goes on; the killed group launched again heals from the live one over the network (no
  checkpoint) and both end, a few steps later, with the same weights and optimizer state;
- the lighthouse lost: the group ends with the error that says so, within its timeout;
- a lighthouse address that answers nothing, or is no address, is refused by the launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.scripts.ft_job import problem
from tests.support.cli import clean_env, overdrive
from tests.support.distributed import free_port

torchft = pytest.importorskip("torchft", reason="fault-tolerant training needs torchft (pip install 'overdrive[ft]')")
from torchft._torchft import LighthouseServer  # noqa: E402  (after the skip: torchft is optional)

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "ft_job.py"
pytestmark = pytest.mark.multiprocess


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(tmp_path, PYTHONPATH=os.pathsep.join((str(ROOT / "src"), str(ROOT))), RUST_LOG="warn",
                     **extra)


def _lighthouse(min_replicas: int) -> LighthouseServer:
    return LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=1000,
                            heartbeat_timeout_ms=2000)


def _address(server: LighthouseServer) -> str:
    return f"http://127.0.0.1:{server.address().rpartition(':')[2]}"


def _launch(tmp_path: Path, out: Path, group: int | None, lighthouse: str | None, env: dict[str, str],
            processes: int = 1, *flags: str) -> subprocess.Popen:
    """One ``overdrive launch`` (its own session, so that all its processes can be killed together)."""
    ft = ["--ft_lighthouse", lighthouse, "--ft_replica_group", str(group), "--ft_num_replica_groups", "2"] \
        if lighthouse else []
    name = f"group{group}" if group is not None else "ddp"
    err = (out / f"{name}.err").open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "overdrive.cli", "launch", "--cpu", "--num_processes", str(processes),
         "--main_process_port", str(free_port()), *ft, *flags, str(JOB), str(out)],
        env=env, cwd=tmp_path,
        stdout=err, stderr=err, start_new_session=True)


def _wait(procs: list[subprocess.Popen], seconds: float, out: Path) -> None:
    deadline = time.monotonic() + seconds
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"a launch did not end within {seconds} s:\n{_logs(out)}")


def _logs(out: Path) -> str:
    return "\n".join(f"==== {path.name}:\n{path.read_text(errors='replace')[-3000:]}" for path in sorted(out.glob("*.err")))


def _steps(out: Path, group: int | str) -> list[dict]:
    path = out / f"steps_{group}_0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _final(out: Path, group: int | str) -> dict:
    return torch.load(out / f"final_{group}.pt", weights_only=False)


def _flat_optimizer(state: dict) -> torch.Tensor:
    tensors = [v.flatten().double() for s in state["state"].values() for v in s.values() if torch.is_tensor(v)]
    return torch.cat(tensors)


def _plain_ddp(samples: int, processes: int, batch: int = 4) -> dict:
    """What tests/scripts/ft_job.py ends with under DDP over ``processes`` ranks, as one process: each step the
    next ``processes * batch`` samples in order (the ranks' shards together), the mean loss over them (DDP
    averages the ranks' mean losses' gradients), and the scheduler stepped once per process (as Accelerate
    steps it without ``split_batches``)."""
    x, y, model, optimizer, scheduler = problem(samples)
    step = processes * batch
    for start in range(0, samples, step):
        torch.nn.functional.mse_loss(model(x[start:start + step]), y[start:start + step]).backward()
        optimizer.step()
        for _ in range(processes):
            scheduler.step()
        optimizer.zero_grad()
    return {"weights": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def _end_soon(out: Path, group: int, steps: int) -> int:
    """Ends the job ``steps`` scheduler steps after the last one ``group`` logged (tests/scripts/ft_job.py reads
    ``end_step``); returns that step."""
    end = _steps(out, group)[-1]["scheduler_step"] + steps
    (out / "end_step.tmp").write_text(str(end))
    (out / "end_step.tmp").rename(out / "end_step")  # whole, never half-written
    return end


def _kill_group_1_and_relaunch(tmp_path: Path, out: Path, server: LighthouseServer, env: dict[str, str],
                               processes: int = 1, *flags: str, start_s: float = 120
                               ) -> tuple[list[subprocess.Popen], float, int]:
    """Groups 0 and 1 launched (``processes`` each); group 1 kills its whole launch in its 8th step (after its
    forward), its files are set aside (``killed_steps_<rank>.jsonl``, ``killed.err``), it is launched again and,
    once it has stepped, the job ends 8 steps later. Returns the three launches (ended), the kill's time and the
    end step."""
    procs: list[subprocess.Popen] = []
    try:
        procs = [_launch(tmp_path, out, 0, _address(server), env, processes, *flags),
                 _launch(tmp_path, out, 1, _address(server), {**env, "FT_KILL_AT_STEP": "8"}, processes, *flags)]
        deadline = time.monotonic() + start_s
        while procs[1].poll() is None and time.monotonic() < deadline:  # it kills itself in its step 8
            time.sleep(0.02)
        killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):  # (its own SIGKILL took the whole launch with it)
            os.killpg(procs[1].pid, signal.SIGKILL)
        procs[1].wait(30)
        assert len(_steps(out, 1)) == 8, _logs(out)
        for rank in range(processes):
            (out / f"steps_1_{rank}.jsonl").rename(out / f"killed_steps_{rank}.jsonl")
        # (if group 1 started second, its first launch healed at its start too: only the relaunch's lines count)
        (out / "group1.err").rename(out / "killed.err")
        procs.append(_launch(tmp_path, out, 1, _address(server), env, processes, *flags))
        deadline = time.monotonic() + start_s
        while not _steps(out, 1) and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.05)
        assert _steps(out, 1), f"the relaunched group took no step within {start_s} s:\n{_logs(out)}"
        end = _end_soon(out, 0, 8)
        _wait([procs[0], procs[2]], 300, out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        server.shutdown()
    return procs, killed_at, end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_faults_two_replica_groups_equal_plain_ddp(tmp_path):
    """Two groups of two processes (DDP inside each; the lighthouse waits for both) train as DDP over the same
    four processes does."""
    server = _lighthouse(min_replicas=2)
    ft_out = tmp_path / "ft"
    ft_out.mkdir()
    env = _env(tmp_path, SAMPLES="64")
    try:
        procs = [_launch(tmp_path, ft_out, g, _address(server), env, 2) for g in (0, 1)]
        _wait(procs, 240, tmp_path)
    finally:
        server.shutdown()
    assert [p.returncode for p in procs] == [0, 0], _logs(ft_out)
    ddp, groups = _plain_ddp(64, processes=4), [_final(ft_out, g) for g in (0, 1)]
    assert len(_steps(ft_out, 0)) == 4  # 64 samples, 4 x 4 a step
    for group in groups:
        for name, reference in ddp["weights"].items():
            torch.testing.assert_close(group["weights"][name], reference, rtol=0, atol=1e-6)
        torch.testing.assert_close(_flat_optimizer(group["optimizer"]), _flat_optimizer(ddp["optimizer"]),
                                   rtol=0, atol=1e-6)
        assert group["scheduler"] == ddp["scheduler"]
    assert "2 group(s) in the first quorum" in (ft_out / "group0.err").read_text()
    # gather_for_metrics: each group its own shards, every sample once over the groups, as plain DDP gathers
    evaluated = [json.loads((ft_out / f"evaluated_{g}.json").read_text()) for g in (0, 1)]
    assert sorted(evaluated[0] + evaluated[1]) == list(range(10))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_groups_of_one_process_equal_plain_ddp_whichever_backward_the_script_calls(tmp_path):
    """Two groups of one process: group 0 back-propagates through ``accelerator.backward`` (its loss carries the
    average's division), group 1 calls ``loss.backward()`` itself (its average divides the gradients): both
    train as DDP over two processes does."""
    server = _lighthouse(min_replicas=2)
    env = _env(tmp_path, SAMPLES="32", FT_OWN_BACKWARD="1")
    try:
        procs = [_launch(tmp_path, tmp_path, g, _address(server), env) for g in (0, 1)]
        _wait(procs, 240, tmp_path)
    finally:
        server.shutdown()
    assert [p.returncode for p in procs] == [0, 0], _logs(tmp_path)
    ddp = _plain_ddp(32, processes=2)
    assert len(_steps(tmp_path, 0)) == 4  # 32 samples, 2 x 4 a step
    for group in (_final(tmp_path, g) for g in (0, 1)):
        for name, reference in ddp["weights"].items():
            torch.testing.assert_close(group["weights"][name], reference, rtol=0, atol=1e-6)
        torch.testing.assert_close(_flat_optimizer(group["optimizer"]), _flat_optimizer(ddp["optimizer"]),
                                   rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_group_drops_out_and_heals_when_launched_again(tmp_path):
    """Group 1 killed outright in its 8th step (after its forward: group 0 loses it mid-step): group 0 drops
    that step, goes on with the same processes, reports the loss, and steps again within 30 s; group 1 launched
    again heals from group 0 (weights, optimizer, scheduler and data position over the network, no checkpoint)
    and both end equal, 8 scheduler steps after the healed group's first step."""
    server = _lighthouse(min_replicas=1)
    out = tmp_path / "out"
    out.mkdir()
    # 500 steps of 0.25 s alone: time for the relaunch on a slow machine; the run ends soon after the heal
    env = _env(tmp_path, SAMPLES="4000", STEP_SLEEP="0.25")
    procs, killed_at, end = _kill_group_1_and_relaunch(tmp_path, out, server, env)
    assert procs[0].returncode == 0 and procs[2].returncode == 0, _logs(out)
    survivor, healed = _steps(out, 0), _steps(out, 1)
    # never restarted (with min_replicas 1 the group that starts second heals at once: it may be either)
    assert {s["pid"] for s in survivor} == {survivor[0]["pid"]}
    after = [s["time"] for s in survivor if s["time"] > killed_at and not s["skipped"]]  # the next committed step
    assert after and after[0] - killed_at < 30, f"the survivor's next step came {after[0] - killed_at:.1f} s later"
    print(f"survivor's next step {after[0] - killed_at:.2f} s after the kill")  # docs/machines.md quotes it (-s)
    assert sum(s["skipped"] for s in survivor) == 1  # the step the loss happened in is dropped, only it
    survivor_err, healed_err = (out / "group0.err").read_text(), (out / "group1.err").read_text()
    # one line each: the lost group and its machine with the new quorum size; the heal's time and size
    assert len(re.findall(r"replica group 1 \(machine [^)\s]+\) was lost; the quorum is now 1 group\(s\) at step "
                          r"\d+, training goes on\n", survivor_err)) == 1, survivor_err
    assert "joined; the quorum is now 2 group(s)" in survivor_err
    assert "was not committed (a replica group was lost during it): its batch is dropped" in survivor_err
    healed_lines = re.findall(r"healed from replica group 0 \(machine [^)\s]+\) in (\d+\.\d\d) s: ([\d.]+) (kB|MB) of "
                              r"weights, optimizer and scheduler states received \(no checkpoint read\)", healed_err)
    assert len(healed_lines) == 1 and float(healed_lines[0][0]) < 30, healed_err
    # the healed group continued at the survivor's data position and ended with it
    assert 0 < len(healed) < len(survivor) and healed[-1]["lr"] == survivor[-1]["lr"]
    assert healed[-1]["scheduler_step"] == survivor[-1]["scheduler_step"] >= end
    first, second = _final(out, 0), _final(out, 1)
    for name, weight in first["weights"].items():
        torch.testing.assert_close(second["weights"][name], weight, rtol=0, atol=0)
    torch.testing.assert_close(_flat_optimizer(second["optimizer"]), _flat_optimizer(first["optimizer"]),
                               rtol=0, atol=0)
    assert second["scheduler"] == first["scheduler"]
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("checkpoint*"))
    evaluated = [json.loads((out / f"evaluated_{g}.json").read_text()) for g in (0, 1)]
    assert sorted(evaluated[0] + evaluated[1]) == list(range(10))  # after the loss and the heal too


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_lighthouse_lost_ends_the_group_with_an_error_in_time(tmp_path):
    """The lighthouse (``overdrive lighthouse``) stopped mid-run: the group ends within its --timeout with the
    error that names the lighthouse, rather than hanging."""
    port = free_port()
    env = _env(tmp_path, SAMPLES="4000", STEP_SLEEP="0.05")
    out = tmp_path / "out"
    out.mkdir()
    lighthouse = subprocess.Popen([sys.executable, "-m", "overdrive.cli", "lighthouse", "--min_replicas", "1",
                                   "--bind", f"127.0.0.1:{port}", "--heartbeat_timeout_ms", "2000"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
    group = None
    try:
        assert lighthouse.stdout is not None
        line = lighthouse.stdout.readline()
        assert f"listening at http://127.0.0.1:{port}" in line, line
        group = _launch(tmp_path, out, 0, f"http://127.0.0.1:{port}", env, 1, "--timeout", "8")
        deadline = time.monotonic() + 120
        while len(_steps(out, 0)) < 5 and time.monotonic() < deadline and group.poll() is None:
            time.sleep(0.05)
        assert len(_steps(out, 0)) >= 5, _logs(out)
        lighthouse.send_signal(signal.SIGTERM)
        assert lighthouse.wait(20) == 0
        lost_at = time.monotonic()
        group.wait(60)
        ended_after = time.monotonic() - lost_at
    finally:
        for proc in (lighthouse, group):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert group.returncode != 0
    err = (out / "group0.err").read_text()
    assert f"could not reach a quorum through the lighthouse at http://127.0.0.1:{port} within 8 s" in err, err
    assert ended_after < 40, f"the group took {ended_after:.1f} s to end after its lighthouse was lost"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_groups_of_different_sizes_end_with_an_error_that_names_them(tmp_path):
    """Group 0 launched with 2 processes, group 1 with 1: at their first quorum both end, in far less than the
    process-group timeout their average would wait for, with the error that names each group's size."""
    server = _lighthouse(min_replicas=2)
    env = _env(tmp_path, SAMPLES="64")
    started = time.monotonic()
    try:
        procs = [_launch(tmp_path, tmp_path, 0, _address(server), env, 2, "--timeout", "60"),
                 _launch(tmp_path, tmp_path, 1, _address(server), env, 1, "--timeout", "60")]
        _wait(procs, 120, tmp_path)
    finally:
        server.shutdown()
    ended_after = time.monotonic() - started
    assert [p.returncode != 0 for p in procs] == [True, True], _logs(tmp_path)
    zero, one = ((tmp_path / f"group{g}.err").read_text() for g in (0, 1))
    assert "must have the same number of processes: this one (group 0) has 2, group 1 (machine " in zero, zero
    assert ") has 1; launch every group with the same --num_processes" in zero, zero
    assert "this one (group 1) has 1, group 0 (machine " in one and ") has 2;" in one, one
    assert ended_after < 50, f"the groups took {ended_after:.1f} s to end"


def test_a_lighthouse_address_that_does_not_answer_is_refused_at_launch(tmp_path):
    env = _env(tmp_path)
    address = f"http://127.0.0.1:{free_port()}"
    result = overdrive("launch", "--cpu", "--ft_lighthouse", address, str(JOB), str(tmp_path), env=env)
    assert result.returncode == 2
    assert f"--ft_lighthouse {address}: no lighthouse answers there" in result.stderr
    assert "overdrive lighthouse --min_replicas N" in result.stderr
    result = overdrive("launch", "--cpu", "--ft_lighthouse", "lighthouse-host", str(JOB), str(tmp_path), env=env)
    assert result.returncode == 2
    assert "'lighthouse-host' is not a lighthouse address; give http://HOST:PORT" in result.stderr
    assert not list(tmp_path.glob("steps_*"))  # nothing was started


def test_the_lighthouse_command_refuses_bad_values_naming_them(tmp_path):
    result = overdrive("lighthouse", "--min_replicas", "0", "--bind", "nowhere", env=_env(tmp_path))
    assert result.returncode == 2
    assert "--min_replicas 0: give 1 or more" in result.stderr
    assert "--bind 'nowhere' is not HOST:PORT" in result.stderr


def test_each_machine_is_one_replica_group_with_its_own_local_launch(tmp_path, monkeypatch):
    """``--num_machines 2 --machine_rank 1 --ft_lighthouse``: machine 1 runs its own torchrun of its share of the
    processes on itself (no rendezvous with machine 0, no --main_process_ip), as replica group 1 of 2."""
    from overdrive.cli import Parser
    from overdrive.cli.launch import add_launch_flags, plan_launch

    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    server = _lighthouse(min_replicas=1)
    try:
        parser = Parser(prog="overdrive launch")
        add_launch_flags(parser)
        parser.add_argument("training_script")
        parser.add_argument("training_script_args", nargs="*")
        plan, _, _ = plan_launch(parser.parse_args(
            ["--cpu", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "4", "--ft_lighthouse",
             _address(server), str(JOB)]))
    finally:
        server.shutdown()
    assert (plan.num_machines, plan.machine_rank, plan.num_processes, plan.main_process_ip) == (1, 0, 2, "127.0.0.1")
    assert plan.worker_config["ft_replica_group"] == 1 and plan.worker_config["ft_num_replica_groups"] == 2
    assert plan.worker_config["ft_lighthouse"] == _address(server)
