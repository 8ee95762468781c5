"""One ``overdrive launch`` per machine under SLURM or Kubeflow: the machine settings come from the cluster
manager's variables (``runtime.cluster.launch_defaults``); a flag beats them, they beat a config file.
In-process, no workers started (tests/machines launches this way across two network namespaces)."""

from __future__ import annotations

import pytest
import yaml

from overdrive.cli import Parser
from overdrive.cli.launch import add_launch_flags, plan_launch

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
KUBEFLOW = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
            "MASTER_ADDR": "ignored", "WORLD_SIZE": "2", "RANK": "1"}


def _plan(monkeypatch, tmp_path, env: dict[str, str], *argv: str, config: dict | None = None):
    for name in ("SLURM_JOB_ID", "SLURM_NODEID", "PET_NNODES", "PET_NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
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
