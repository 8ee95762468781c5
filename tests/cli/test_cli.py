"""The ``overdrive`` command without starting training processes: errors, config files, env, and the
pieces the launcher is built from (cluster detectors, torchrun arguments, failure reports)."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import yaml

from overdrive.launchers import config_file as cf
from overdrive.launchers.failure_report import describe_failures, traceback_tail
from overdrive.launchers.launch_plan import Command, LaunchPlan
from overdrive.launchers.torchrun import torchrun_argv
from overdrive.runtime.cluster import _tasks_per_node, detect_process_info, first_host
from tests.support.cli import clean_env, overdrive


# -- usage errors --------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_bad_flag_values_are_all_reported_with_choices(tmp_path):
    result = overdrive("launch", "--mixed_precision", "fp33", "--num-processes", "0", "--rdzv_backend", "c10", "--gpu_ids",
                       "first", "missing_script.py", env=clean_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "5 problems" in err and "overdrive launch: error" in err
    assert "--mixed_precision: 'fp33' is not valid; choose from no, fp16, bf16, fp8" in err
    assert "--num_processes: 0 must be 1 or more" in err
    assert "--rdzv_backend: 'c10' is not valid; choose from static, c10d, etcd, etcd-v2 (did you mean 'c10d'?)" in err
    assert "--gpu_ids: 'first' is not valid" in err
    assert "training script 'missing_script.py' does not exist" in err and str(tmp_path) in err


@pytest.mark.timeout(60)
def test_missing_script_suggests_the_nearest_file(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = overdrive("launch", "trian.py", env=clean_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "training script 'trian.py' does not exist" in result.stderr
    assert "did you mean 'train.py'" in result.stderr


@pytest.mark.timeout(60)
def test_unknown_flag_and_command_suggest_the_nearest(tmp_path):
    result = overdrive("launch", "--num_proceses", "2", "train.py", env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "'--num_proceses' is not a flag of 'overdrive launch' (did you mean --num_processes?)" in result.stderr
    result = overdrive("lanch", env=clean_env(tmp_path))
    assert result.returncode == 2 and "unknown command 'lanch' (did you mean 'launch'?)" in result.stderr


@pytest.mark.timeout(60)
def test_processes_must_divide_among_machines_and_need_an_address(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    result = overdrive("launch", "--num_processes", "3", "--num_machines", "2", "--machine_rank", "2", str(script),
                       env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "num_processes 3 (from --num_processes)" in result.stderr and "must divide evenly" in result.stderr
    assert "machine_rank 2 (from --machine_rank) must be below num_machines 2" in result.stderr
    assert "needs --main_process_ip" in result.stderr


@pytest.mark.timeout(60)
def test_bad_config_file_names_file_key_and_nearest(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_proceses: 2\nmixed_precision: fp61\ndistributed_type: MULTI_GPUS\nuse_cpu: maybe\n")
    script = tmp_path / "s.py"
    script.write_text("")
    result = overdrive("launch", "--config_file", str(bad), str(script), env=clean_env(tmp_path))
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert f"config file {bad} has 4 problems" in err
    assert "unknown key 'num_proceses' (did you mean 'num_processes'?)" in err
    assert "mixed_precision: 'fp61' is not valid; choose from no, fp16, bf16, fp8" in err
    assert "(did you mean 'MULTI_GPU'?)" in err
    assert "use_cpu: 'maybe' is not a boolean" in err
    missing = overdrive("launch", "--config_file", str(tmp_path / "nope.yaml"), str(script), env=clean_env(tmp_path))
    assert missing.returncode == 2 and f"--config_file {tmp_path / 'nope.yaml'}: the file does not exist" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("num_processes: [2\n")
    result = overdrive("launch", "--config_file", str(broken), str(script), env=clean_env(tmp_path))
    assert result.returncode == 2 and f"config file {broken}: is not valid YAML" in result.stderr


def test_config_checks_report_every_problem_at_once(tmp_path):
    with pytest.raises(cf.ConfigError) as info:
        cf.validate_config({"num_machines": 0, "rdzv_backend": "etdc", "dynamo_config": {"dynamo_backend": "inductr",
                                                                                          "dynamo_mod": "default"}},
                           tmp_path / "x.yaml")
    message = str(info.value)
    assert "num_machines: 0 must be 1 or more" in message
    assert "'etdc' is not valid" in message and "(did you mean 'etcd'?)" in message
    assert "dynamo_config.dynamo_backend: 'inductr'" in message and "(did you mean 'INDUCTOR'?)" in message
    assert "unknown key 'dynamo_mod' (did you mean 'dynamo_mode'?)" in message


# -- config files --------------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_config_default_writes_the_default_location_and_keeps_an_existing_file(tmp_path):
    env = clean_env(tmp_path)
    env.pop("OVERDRIVE_CONFIG_FILE")
    result = overdrive("config", "default", "--mixed_precision", "bf16", env=env)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "hf" / "overdrive" / "default_config.yaml"
    written = yaml.safe_load(path.read_text())
    assert written["mixed_precision"] == "bf16" and written["compute_environment"] == "LOCAL_MACHINE"
    assert written["num_processes"] == 1 and written["use_cpu"] is True  # this machine has no GPU
    again = overdrive("config", "default", "--mixed_precision", "fp16", env=env)
    assert again.returncode == 0 and "exists already" in again.stderr
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "bf16"
    forced = overdrive("config", "default", "--mixed-precision", "fp16", "--force", env=env)
    assert forced.returncode == 0 and yaml.safe_load(path.read_text())["mixed_precision"] == "fp16"


@pytest.mark.timeout(60)
def test_config_update_rewrites_legacy_keys(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nfp16: true\n"
                   "dynamo_backend: 'NO'\nnum_processes: 2\n")
    result = overdrive("config", "update", "--config_file", str(old), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    new = yaml.safe_load(old.read_text())
    assert "fp16" not in new and "dynamo_backend" not in new
    assert new["mixed_precision"] == "fp16" and new["dynamo_config"] == {"dynamo_backend": "NO"}
    assert new["num_processes"] == 2 and new["rdzv_backend"] == "static" and new["num_machines"] == 1
    missing = overdrive("config", "update", "--config_file", str(tmp_path / "none.yaml"), env=clean_env(tmp_path))
    assert missing.returncode == 2 and "no config file at" in missing.stderr


@pytest.mark.timeout(60)
def test_config_questionnaire_from_answers_on_stdin(tmp_path):
    target = tmp_path / "asked.yaml"
    # kind: multi-CPU; 1 machine; 4 processes; no dynamo; mixed precision: a typo first, then bf16
    answers = "1\n\n4\nno\nbf17\nbf16\n"
    result = overdrive("config", "--config_file", str(target), env=clean_env(tmp_path), stdin=answers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "'bf17' is not valid; choose from no, fp16, bf16, fp8" in result.stdout
    written = cf.load_config(target)
    assert written["distributed_type"] == "MULTI_CPU" and written["num_processes"] == 4
    assert written["mixed_precision"] == "bf16" and written["use_cpu"] is True


def test_accelerate_config_file_is_read_as_it_is(tmp_path):
    path = tmp_path / "default_config.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\ndowncast_bf16: 'no'\n"
        "enable_cpu_affinity: false\ngpu_ids: all\nmachine_rank: 0\nmain_training_function: main\n"
        "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 8\nrdzv_backend: static\nsame_network: true\n"
        "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n"
        "dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: default\nfsdp_config: {}\n"
        "deepspeed_config: {}\nmegatron_lm_config: {}\nmain_process_ip: null\nmain_process_port: null\n")
    config = cf.load_config(path)
    assert config["num_processes"] == 8 and config["mixed_precision"] == "bf16" and config["downcast_bf16"] is False
    assert config["dynamo_config"]["dynamo_backend"] == "INDUCTOR"


def test_default_config_path_order(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "mine.yaml"))
    assert cf.default_config_path() == tmp_path / "mine.yaml"
    monkeypatch.delenv("OVERDRIVE_CONFIG_FILE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cf.default_config_path() == tmp_path / "hf" / "overdrive" / "default_config.yaml"
    assert cf.find_config().path is None
    accelerate = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    accelerate.parent.mkdir(parents=True)
    accelerate.write_text("num_processes: 2\n")
    assert cf.find_config().path == accelerate  # Accelerate's file when overdrive has none
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cf.default_config_path() == tmp_path / ".cache" / "overdrive" / "default_config.yaml"


@pytest.mark.timeout(60)
def test_env_reports_versions_devices_and_config(tmp_path):
    env = clean_env(tmp_path)
    cf.save_config(cf.basic_config("fp16"), env["OVERDRIVE_CONFIG_FILE"])
    result = overdrive("env", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    import torch

    from overdrive import __version__

    assert f"- overdrive version: {__version__}" in out
    assert f"- PyTorch version: {torch.__version__}" in out and "- Python version:" in out and "- Platform:" in out
    assert "- Accelerator: none" in out and "gloo" in out
    assert f"- Config file: {env['OVERDRIVE_CONFIG_FILE']} ($OVERDRIVE_CONFIG_FILE)" in out
    assert "\t- mixed_precision: fp16" in out


# -- building blocks -----------------------------------------------------------------------------------
def test_torchrun_arguments_for_each_topology():
    script = Command("train.py", ("--lr", "1"))
    one = torchrun_argv(LaunchPlan(num_processes=2), script, "/logs")
    assert "--nproc-per-node=2" in one and "--nnodes=1" in one and "--redirects=2" in one
    assert not any(a.startswith(("--master-port", "--rdzv-endpoint")) for a in one)  # torchrun picks a free port
    assert one[-3:] == ["train.py", "--lr", "1"]
    static = torchrun_argv(LaunchPlan(num_processes=8, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
                                      main_process_port=1234), script, "/logs")
    assert {"--nnodes=2", "--nproc-per-node=4", "--master-addr=10.0.0.1", "--master-port=1234",
            "--node-rank=1"} <= set(static)
    c10d = torchrun_argv(LaunchPlan(num_processes=4, num_machines=2, main_process_ip="h", rdzv_backend="c10d",
                                    max_restarts=3), Command("pkg.mod", module=True), "/logs")
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=h:29500", "--max-restarts=3", "--no-python"} <= set(c10d)
    # an elastic job through etcd: the endpoint is the etcd server's, from the main address and port as in Accelerate
    etcd = torchrun_argv(LaunchPlan(num_processes=4, num_machines=2, min_machines=1, main_process_ip="etcd-host",
                                    main_process_port=2379, rdzv_backend="etcd-v2"), script, "/logs")
    assert {"--nnodes=1:2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=etcd-host:2379"} <= set(etcd)
    # every worker starts in overdrive's entry point (dies with the launcher), which runs the module
    assert c10d[-6:] == [sys.executable, "-u", "-m", "overdrive.launchers.worker", "module", "pkg.mod"]
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser().parse_args(static)  # torchrun's own parser accepts what we build
    assert parsed.nproc_per_node == "4" and parsed.training_script_args[-3:] == ["train.py", "--lr", "1"]


def test_a_restart_is_reported_with_the_machines_and_processes_it_has(capsys):
    import logging

    from overdrive.launchers.torchrun import RestartReporter, quiet_torchelastic

    agent = logging.getLogger(RestartReporter.LOGGER)
    level = agent.level

    def rendezvous(restart: int, machines: int, processes: int) -> None:  # what torchrun's agent logs
        agent.info("[default] Rendezvous complete for workers. Result:\n  restart_count=%(restart_count)s\n",
                   {"role": "default", "restart_count": restart, "group_world_size": machines,
                    "global_world_sizes": [processes] * 2})

    with quiet_torchelastic(debug=False), RestartReporter.attached(LaunchPlan(num_processes=4, max_restarts=3)):
        rendezvous(0, 2, 4)  # the first group: nothing to say
        rendezvous(1, 1, 2)  # an elastic job that lost a machine
        rendezvous(2, 1, 2)
    rendezvous(3, 2, 4)  # after the launch: not reported
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "overdrive launch: the workers started again (restart 1 of 3) with 1 machine, 2 processes in all "
        "(before: 2 machines, 4 processes)",
        "overdrive launch: the workers started again (restart 2 of 3) with 1 machine, 2 processes in all "
        "(before: 2 machines, 4 processes)"], err
    assert agent.level == level and not agent.handlers


def test_failure_report_names_first_rank_signal_and_traceback(tmp_path):
    attempt = tmp_path / "run_x" / "attempt_0"
    for rank, text in ((0, "RuntimeError: Connection closed by peer\n"),
                       (1, "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"t.py\", line 3\n"
                           "[rank1]: ValueError: boom\n")):
        (attempt / str(rank)).mkdir(parents=True)
        (attempt / str(rank) / "stderr.log").write_text(text)
    os.utime(attempt / "0" / "stderr.log", (1e9, 2e9))  # rank 0 wrote last: rank 1 failed first
    os.utime(attempt / "1" / "stderr.log", (1e9, 1e9))
    failures = {0: SimpleNamespace(local_rank=0, exitcode=1, error_file="<N/A>", error_file_data={}, timestamp=5),
                1: SimpleNamespace(local_rank=1, exitcode=1, error_file="<N/A>", error_file_data={}, timestamp=5),
                2: SimpleNamespace(local_rank=2, exitcode=-15, error_file="<N/A>", error_file_data={}, timestamp=1)}
    report, code = describe_failures(failures, str(tmp_path))
    assert report.splitlines()[0].startswith("overdrive launch: rank 1 exited with code 1")
    assert "[rank1]: ValueError: boom" in report and "rank 0 also failed" in report
    assert "rank 2 was stopped (SIGTERM)" in report and code == 1
    shown, _ = describe_failures(failures, str(tmp_path), shown=True)  # the traceback reached the terminal already
    assert shown.splitlines()[1] == "  rank 1's stderr is above, ending in ValueError" and "boom" not in shown
    killed = {3: SimpleNamespace(local_rank=3, exitcode=-9, error_file="<N/A>", error_file_data={}, timestamp=1)}
    report, code = describe_failures(killed, str(tmp_path))
    assert "rank 3 ended by signal SIGKILL (exit code -9)" in report and code == 137


def test_traceback_tail_keeps_the_last_traceback():
    text = "noise\nTraceback (most recent call last):\n  old\nKeyError\nmore noise\n" \
           "Traceback (most recent call last):\n  File 'x'\nValueError: last\n"
    assert traceback_tail(text) == ["Traceback (most recent call last):", "  File 'x'", "ValueError: last"]
    assert traceback_tail("\n".join(str(i) for i in range(30)), max_lines=4) == ["...", "27", "28", "29"]


def test_slurm_and_mpi_variables_are_recognised():
    slurm = detect_process_info({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                                 "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x4)",
                                 "SLURM_JOB_NODELIST": "gpu[003-006]", "SLURM_JOB_ID": "4242"})
    assert (slurm.rank, slurm.world_size, slurm.local_rank, slurm.local_world_size, slurm.node_rank) == (5, 8, 1, 2, 2)
    assert slurm.master_addr == "gpu003" and slurm.master_port == 15000 + 4242 and slurm.source == "slurm"
    ompi = detect_process_info({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                                "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "7"})
    assert (ompi.rank, ompi.world_size, ompi.local_rank, ompi.node_rank, ompi.master_addr, ompi.master_port) == \
        (3, 4, 1, 1, "n1", 7)
    hydra = detect_process_info({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (hydra.rank, hydra.world_size, hydra.local_rank, hydra.source) == (1, 2, 1, "mpich / intel mpi")
    torchrun = detect_process_info({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert torchrun.rank == 1 and torchrun.world_size == 2  # torchrun under srun: torchrun's variables win
    ray = detect_process_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                               "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "41000"})  # Ray Train
    assert (ray.rank, ray.world_size, ray.local_rank, ray.node_rank, ray.master_addr) == (3, 4, 1, 1, "10.0.0.5")
    assert first_host("a,b") == "a" and first_host("node[1-2],x") == "node1" and _tasks_per_node("3,2(x2)", 2) == 2


def test_questionnaire_on_a_machine_with_gpus(monkeypatch):
    from overdrive.cli.config_cmd import Asker, questionnaire

    # multi-GPU, 2 machines, rank 1, ip, port, same network, c10d, 16 processes, GPUs 0-7, dynamo inductor, fp16
    answers = iter(["2", "2", "1", "10.1.2.3", "", "yes", "c10d", "16", "0,1,2,3,4,5,6,7", "y", "inductor", "fp16"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    config = questionnaire(Asker(), "cuda", 8)
    assert config["distributed_type"] == "MULTI_GPU" and config["use_cpu"] is False
    assert (config["num_machines"], config["machine_rank"], config["main_process_ip"]) == (2, 1, "10.1.2.3")
    assert config["main_process_port"] == 29500 and config["rdzv_backend"] == "c10d" and config["same_network"]
    assert config["num_processes"] == 16 and config["gpu_ids"] == "0,1,2,3,4,5,6,7"
    assert config["dynamo_config"] == {"dynamo_backend": "INDUCTOR"} and config["mixed_precision"] == "fp16"
    assert cf.validate_config(config) == config


def test_failure_report_names_the_killed_rank_however_late_its_death_was_noticed(tmp_path):
    # rank 1 killed (SIGKILL, nothing on its stderr); rank 0's collective then lost its connection and rank 0
    # exited on its own before torchelastic's agent, slowed by a loaded machine, noticed rank 1's death: rank 1's
    # only time is the whole second the agent noticed it, later than rank 0's traceback. The report must not
    # take the consequence (a lost connection) for the cause.
    attempt = tmp_path / "run_x" / "attempt_0"
    for rank, text in ((0, "[rank0]: RuntimeError: [pair.cc:537] Read error [127.0.0.1]:28081: Connection reset by "
                           "peer. This is typically caused by a remote worker hanging\n"), (1, "")):
        (attempt / str(rank)).mkdir(parents=True)
        (attempt / str(rank) / "stderr.log").write_text(text)
    os.utime(attempt / "0" / "stderr.log", (1e9, 2e9 + 0.3))
    failures = {0: SimpleNamespace(local_rank=0, exitcode=1, error_file="<N/A>", error_file_data={}, timestamp=2e9 + 1),
                1: SimpleNamespace(local_rank=1, exitcode=-9, error_file="<N/A>", error_file_data={},
                                   timestamp=2e9 + 1)}
    report, code = describe_failures(failures, str(tmp_path))
    assert report.splitlines()[0].startswith("overdrive launch: rank 1 ended by signal SIGKILL"), report
    assert "rank 0 also failed" in report and code == 137


def test_the_stderr_copier_stops_only_after_its_thread_however_slow_the_output(tmp_path, monkeypatch):
    import sys
    import threading
    import time

    from overdrive.launchers.stderr_copier import StderrCopier

    for rank in range(4):
        (tmp_path / "run" / "attempt_0" / str(rank)).mkdir(parents=True)
        (tmp_path / "run" / "attempt_0" / str(rank) / "stderr.log").write_text(f"line {rank}\n")

    class SlowStream:  # a terminal or pipe that a loaded machine drains slowly: 4 writes take ~5.6 s
        def __init__(self) -> None:
            self.parts: list[str] = []
            self.writing = threading.Event()

        def write(self, text: str) -> None:
            self.writing.set()
            time.sleep(1.4)
            self.parts.append(text)

        def flush(self) -> None:
            pass

    slow = SlowStream()
    monkeypatch.setattr(sys, "stderr", slow)
    copier = StderrCopier(str(tmp_path), interval=0.01)
    copier.start()
    assert slow.writing.wait(60)  # the copier's thread is inside its copy
    copier.stop()
    assert slow.parts == [f"line {rank}\n" for rank in range(4)]  # all of it, in order, when stop() returns


def test_the_stderr_copier_copies_an_attempt_written_again_from_the_start(tmp_path, monkeypatch):
    # a restart that counts none (machines joined or left) makes torchrun remove the attempt's folder and write
    # the same paths again: the new workers' output, shorter than what was copied, must come out too
    import shutil
    import sys
    import time

    from overdrive.launchers.stderr_copier import StderrCopier

    class Stream:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def write(self, text: str) -> None:
            self.parts.append(text)

        def flush(self) -> None:
            pass

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 30
        while text not in "".join(stream.parts) and time.monotonic() < deadline:
            time.sleep(0.01)

    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    log = tmp_path / "run" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("the first round's workers wrote this\n")
    copier = StderrCopier(str(tmp_path), interval=0.01)
    copier.start()
    wait_for("first round")
    shutil.rmtree(tmp_path / "run" / "attempt_0")
    log.parent.mkdir(parents=True)
    log.write_text("round 2\n")
    wait_for("round 2")
    copier.stop()
    assert "".join(stream.parts) == "the first round's workers wrote this\nround 2\n"
