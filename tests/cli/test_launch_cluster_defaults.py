"""One ``overdrive launch`` per machine under SLURM or Kubeflow: the machine settings come from the cluster
manager's variables (``runtime.cluster.launch_defaults``); a flag beats them, they beat a config file.
In-process, no workers started (tests/machines launches this way across two network namespaces)."""

from __future__ import annotations

import pytest
import yaml

from overdrive.cli import Parser, UsageError
from overdrive.cli.launch import add_launch_flags, plan_launch
from overdrive.launchers.launch_plan import Command
from overdrive.launchers.torchrun import torchrun_argv

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
KUBEFLOW = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
            "MASTER_ADDR": "ignored", "WORLD_SIZE": "2", "RANK": "1"}


def _plan(monkeypatch, tmp_path, env: dict[str, str], *argv: str, config: dict | None = None):
    for name in ("SLURM_JOB_ID", "SLURM_NODEID", "PET_NNODES", "PET_NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_MAX_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config or {}))
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(path))
    script = tmp_path / "train.py"
    script.write_text("")
    parser = Parser(prog="overdrive launch")
    add_launch_flags(parser)
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs="*")
    plan, _, _ = plan_launch(parser.parse_args(["--cpu", "--num_processes", "4", *argv, str(script)]))
    return plan


@pytest.mark.parametrize("env, want", [
    (SLURM, (2, 1, "gpu003", 15000 + 4242)),
    (KUBEFLOW, (2, 1, "job-master-0", 23456)),
])
def test_machine_settings_come_from_the_cluster_manager(monkeypatch, tmp_path, env, want):
    plan = _plan(monkeypatch, tmp_path, env, config={"machine_rank": 0, "num_machines": 1})  # the file loses
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip, plan.main_process_port) == want


def test_a_flag_beats_the_cluster_managers_variables(monkeypatch, tmp_path):
    plan = _plan(monkeypatch, tmp_path, SLURM, "--machine_rank", "0", "--main_process_port", "29600")
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip, plan.main_process_port) == \
        (2, 0, "gpu003", 29600)


def test_outside_a_cluster_manager_nothing_changes(monkeypatch, tmp_path):
    plan = _plan(monkeypatch, tmp_path, {})
    assert (plan.num_machines, plan.machine_rank, plan.main_process_ip) == (1, 0, None)


def test_an_elastic_number_of_machines_reaches_torchrun_as_nnodes_min_max(monkeypatch, tmp_path):
    # overdrive's extension of Accelerate's --num_machines (an int there): MIN:MAX, with the c10d rendezvous
    plan = _plan(monkeypatch, tmp_path, {}, "--num_machines", "1:2", "--rdzv_backend", "c10d", "--main_process_ip",
                 "10.0.0.1", "--max_restarts", "1")
    assert (plan.min_machines, plan.num_machines, plan.processes_per_machine) == (1, 2, 2)
    argv = torchrun_argv(plan, Command("train.py"), "/logs")
    assert {"--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500"} <= set(argv)
    from torch.distributed.run import config_from_args, get_args_parser

    config, _, _ = config_from_args(get_args_parser().parse_args(argv))  # torchrun's own reading of it
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 2, 2)
    fixed = _plan(monkeypatch, tmp_path, {}, "--num_machines", "2", "--main_process_ip", "10.0.0.1")
    assert (fixed.min_machines, fixed.num_machines) == (2, 2)
    assert "--nnodes=2" in torchrun_argv(fixed, Command("train.py"), "/logs")


@pytest.mark.parametrize("value, extra, message", [
    ("1:2", (), "num_machines 1:2 (from --num_machines) is elastic: it needs torchrun's dynamic rendezvous: "
                "add --rdzv_backend c10d (or etcd-v2, with an etcd server; rdzv_backend static, from default)"),
    ("2:1", ("--rdzv_backend", "c10d"), "--num_machines: '2:1' has MIN 2 above MAX 1; give MIN:MAX with MIN <= MAX"),
    ("1:x", ("--rdzv_backend", "c10d"), "--num_machines: '1:x' is not a number of machines; give N, or MIN:MAX"),
    ("0:2", ("--rdzv_backend", "c10d"), "--num_machines: '0:2' is not a number of machines"),
])
def test_a_wrong_elastic_number_of_machines_is_refused_naming_it(monkeypatch, tmp_path, value, extra, message):
    with pytest.raises(UsageError) as err:
        _plan(monkeypatch, tmp_path, {}, "--num_machines", value, "--main_process_ip", "10.0.0.1", *extra)
    assert any(message in problem for problem in err.value.problems), err.value.problems


def test_an_elastic_kubeflow_pytorchjob_is_read_from_its_variables(monkeypatch, tmp_path):
    # elasticPolicy {rdzvBackend: c10d, minReplicas: 1, maxReplicas: 3, maxRestarts: 100}: no MASTER_ADDR
    env = {"PET_NNODES": "1:3", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-worker-0:23456",
           "PET_RDZV_ID": "job", "PET_MAX_RESTARTS": "100", "PET_NPROC_PER_NODE": "2"}
    plan = _plan(monkeypatch, tmp_path, env, "--num_processes", "6")
    assert (plan.min_machines, plan.num_machines, plan.main_process_ip, plan.main_process_port, plan.rdzv_backend,
            plan.max_restarts) == (1, 3, "job-worker-0", 23456, "c10d", 100)
