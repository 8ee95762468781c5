"""``overdrive launch`` and the launchers, run as a user would: real processes on gloo over 127.0.0.1.

Each torchrun launch costs 5-15 s on a 2-core machine, so each test launches once or twice and checks
several things about that run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cli import SCRIPTS, clean_env, overdrive

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # real launches (torchrun)

TRAIN = str(SCRIPTS / "train_ddp.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lines(output: str, tag: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith(tag + " ")]


def check_trained(output: str, world: int) -> list[dict]:
    results = lines(output, "RESULT")
    assert sorted(r["rank"] for r in results) == list(range(world)), output
    assert all(r["world"] == world and r["spread"] == 0.0 for r in results), results  # DDP kept ranks equal
    return results


@pytest.mark.timeout(180)
def test_config_default_is_read_back_by_launch_and_flags_win(tmp_path):
    env = clean_env(tmp_path)
    del env["OMP_NUM_THREADS"]  # so the launcher's default applies
    made = overdrive("config", "default", "--mixed_precision", "bf16", "--num_processes", "2", env=env)
    assert made.returncode == 0, made.stderr
    # no --config_file: launch reads the default file; a flag beats it
    result = overdrive("launch", "--gradient_accumulation_steps", "2", TRAIN, "--steps", "3", env=env, timeout=170)
    assert result.returncode == 0, result.stderr
    assert "overdrive launch: starting 2 CPU processes on gloo (no GPU found)" in result.stderr
    assert env["OVERDRIVE_CONFIG_FILE"] in result.stderr
    configs = lines(result.stdout, "CONFIG")
    assert len(configs) == 2
    for seen in configs:
        assert seen["world"] == 2 and seen["mixed_precision"] == "bf16"  # from the file
        assert seen["gradient_accumulation_steps"] == 2  # from the flag
        assert seen["launch_config"]["config_file"] == env["OVERDRIVE_CONFIG_FILE"]
        threads = max(len(os.sched_getaffinity(0)) // 2, 1)  # this machine's cores shared by 2 processes
        assert seen["omp_num_threads"] == str(threads) and seen["torch_threads"] == threads
    check_trained(result.stdout, 2)


@pytest.mark.timeout(180)
def test_accelerate_yaml_file_is_read_by_launch(tmp_path):
    accelerate_file = tmp_path / "accelerate.yaml"
    accelerate_file.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_GPU",
        "downcast_bf16": "no", "enable_cpu_affinity": False, "gpu_ids": "all", "machine_rank": 0,
        "main_training_function": "main", "mixed_precision": "fp16", "num_machines": 1, "num_processes": 2,
        "rdzv_backend": "static", "same_network": True, "tpu_env": [], "tpu_use_cluster": False,
        "tpu_use_sudo": False, "use_cpu": False, "dynamo_config": {"dynamo_backend": "NO"}, "fsdp_config": {},
    }))
    result = overdrive("launch", "--config-file", str(accelerate_file), "--num_cpu_threads_per_process", "2", TRAIN,
                       "--steps", "2", env=clean_env(tmp_path), timeout=170)
    assert result.returncode == 0, result.stderr
    configs = lines(result.stdout, "CONFIG")
    assert len(configs) == 2 and all(c["mixed_precision"] == "fp16" for c in configs)
    launched = configs[0]["launch_config"]
    # MULTI_GPU on a machine without a GPU: as under accelerate launch, each process trains alone
    assert launched["distributed_type"] == "MULTI_GPU" and launched["cpu"] is False
    assert [c["world"] for c in configs] == [1, 1] and "each training alone" in result.stderr
    assert launched["num_processes"] == 2 and launched["fsdp_config"] == {} and launched["dynamo_backend"] == "no"
    assert configs[0]["omp_num_threads"] == "2"


@pytest.mark.timeout(240)
def test_two_machines_on_localhost_train_one_model_on_four_ranks(tmp_path):
    port, env = free_port(), clean_env(tmp_path)
    common = ["--num_machines", "2", "--num_processes", "4", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port), "--rdzv_backend", "c10d"]
    machines = [subprocess.Popen([sys.executable, "-m", "overdrive.cli", "launch", *common, "--machine_rank", str(rank),
                                  TRAIN, "--steps", "4"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for rank in (0, 1)]
    outputs = []
    try:
        for machine in machines:
            out, err = machine.communicate(timeout=220)
            outputs.append((machine.returncode, out, err))
    finally:
        for machine in machines:
            machine.kill()
    assert [code for code, _, _ in outputs] == [0, 0], outputs
    check_trained(outputs[0][1] + outputs[1][1], 4)
    assert "on machine 0 of 2, 4 in all, meeting at 127.0.0.1" in outputs[0][2]
    assert all(len(lines(out, "RESULT")) == 2 for _, out, _ in outputs)  # 2 processes on each machine


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_a_failing_rank_stops_the_others_and_is_named(tmp_path, how):
    flag = "--fail-rank" if how == "raise" else "--kill-rank"
    # 10**9 steps never end: the command returns (before its generous limit, which holds on a loaded machine)
    # only because rank 1 died and the rest were stopped
    result = overdrive("launch", "--num_processes", "2", TRAIN, "--steps", str(10**9), flag, "1",
                       env=clean_env(tmp_path), timeout=270)
    assert result.returncode != 0, result.stderr
    report = result.stderr[result.stderr.index("overdrive launch: rank"):]
    assert report.startswith("overdrive launch: rank 1 ")
    if how == "raise":  # the traceback once, as the rank wrote it; the report names it
        assert "  rank 1's stderr is above, ending in RuntimeError" in report
        assert result.stderr.count("RuntimeError: deliberate failure on rank 1") == 1, result.stderr
        assert result.stderr.count("Traceback (most recent call last)") == 1, result.stderr
    else:
        assert "ended by signal SIGKILL (exit code -9)" in report and result.returncode == 128 + 9
    assert "RESULT" not in result.stdout


@pytest.mark.timeout(180)
def test_max_restarts_restarts_the_group(tmp_path):
    env = clean_env(tmp_path)
    result = overdrive("launch", "--num_processes", "2", "--max_restarts", "1", TRAIN, "--steps", "4",
                       "--fail-first-attempt", env=env, timeout=170)
    assert result.returncode == 0, result.stderr
    assert "deliberate failure on the first attempt" in result.stderr
    assert sorted(c["restart"] for c in lines(result.stdout, "CONFIG")) == [0, 0, 1, 1]
    check_trained(result.stdout, 2)


@pytest.mark.timeout(120)
def test_module_flag_runs_a_module(tmp_path):
    result = overdrive("launch", "--num_processes", "1", "-m", "platform", env=clean_env(tmp_path), timeout=110)
    assert result.returncode == 0, result.stderr
    assert "Linux" in result.stdout or "Darwin" in result.stdout


@pytest.mark.timeout(180)
def test_notebook_and_debug_launchers(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPTS / "notebook_driver.py"), str(free_port())],
                            env=clean_env(tmp_path), capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr
    notebook = lines(result.stdout, "NOTEBOOK")[0]
    assert sorted(notebook) == ["0", "1"]
    for rank, seen in notebook.items():
        assert seen["rank"] == int(rank) and seen["world"] == 2 and seen["spread"] == 0.0
        assert seen["mixed_precision"] == "bf16" and seen["threads"] == 1
    failure = lines(result.stdout, "FAILURE")[0]  # from debug_launcher
    assert failure["message"].startswith("fail_on_rank_one: rank 1 exited with code 1")
    assert "ValueError: rank one refuses" in failure["message"] and failure["seconds"] < 30


def _run_ranks(tmp_path: Path, per_rank_env: list[dict[str, str]]) -> list[str]:
    port = free_port()
    # the CPU setting, which joins CPU processes under Accelerate too (without it each would train alone)
    procs = [subprocess.Popen([sys.executable, TRAIN, "--steps", "3"],
                              env=clean_env(tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                            ACCELERATE_USE_CPU="true", **extra),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for extra in per_rank_env]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=150)
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    return outputs


@pytest.mark.timeout(180)
def test_srun_variables_train_without_the_launcher(tmp_path):
    outputs = _run_ranks(tmp_path, [
        {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_NODEID": "0",
         "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "77"} for r in (0, 1)])
    check_trained("".join(outputs), 2)


@pytest.mark.timeout(180)
def test_mpirun_variables_train_without_the_launcher(tmp_path):
    outputs = _run_ranks(tmp_path, [
        {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
         "OMPI_COMM_WORLD_LOCAL_SIZE": "2"} for r in (0, 1)])
    check_trained("".join(outputs), 2)


@pytest.mark.timeout(180)
def test_overdrive_test_says_this_machine_can_train(tmp_path):
    result = overdrive("test", "--num_processes", "2", env=clean_env(tmp_path), timeout=170)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "overdrive test: this machine can train: 2 process(es) on cpu (gloo)" in result.stdout
    assert "ranks' weights differ by 0.0e+00" in result.stdout
