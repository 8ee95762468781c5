"""``overdrive doctor`` finds what would stop a job and says what to fix (no torch, no processes)."""

from __future__ import annotations

import socket

from overdrive.cli import main


def _doctor(capsys, *args: str) -> tuple[int, str]:
    code = main(["doctor", *args])
    return code, capsys.readouterr().out


def test_doctor_passes_on_a_free_port_and_names_each_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out = _doctor(capsys, "--main_process_port", str(port), "--checkpoint_dir", str(tmp_path / "ck"))
    assert code == 0, out
    for name in ("hostname", "port", "interface", "disk", "writable", "shared folder"):
        assert f"  ok  {name}:" in out
    assert [p.name for p in tmp_path.rglob("*")] == ["ck"]  # nothing left behind, here or in the folder


def test_doctor_fails_a_checkpoint_folder_that_does_not_exist_and_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    missing = tmp_path / "typo" / "runs"
    for machines in (["--num_machines", "1"], ["--num_machines", "2", "--main_process_ip", "127.0.0.1",
                                               "--main_process_port", "1"]):
        code, out = _doctor(capsys, *machines, "--checkpoint_dir", str(missing))
        assert code == 1
        assert f"FAIL  checkpoint folder: {missing} does not exist (nearest existing folder: {tmp_path})" in out
        assert not (tmp_path / "typo").exists()


def test_doctor_on_two_machines_leaves_markers_until_the_last_one_sees_all(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    markers = tmp_path / ".overdrive_doctor"
    markers.mkdir()
    (markers / "other-machine.json").write_text("{}")  # what the other machine's doctor wrote in the shared folder
    code, out = _doctor(capsys, "--num_machines", "2", "--main_process_ip", "127.0.0.1", "--checkpoint_dir",
                        str(tmp_path), "--main_process_port", "1")
    assert "  ok  shared folder: seen from here: " in out and "other-machine" in out
    assert not markers.exists()


def test_doctor_fails_a_taken_port_a_missing_interface_and_an_unreachable_main(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OVERDRIVE_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = _doctor(capsys, "--main_process_port", str(port), "--checkpoint_dir", str(tmp_path))
        assert code == 1
        assert f"FAIL  port: port {port} cannot be opened on this machine" in out
        assert "GLOO_SOCKET_IFNAME=nosuch0 names nosuch0, which this machine does not have" in out
        # a second machine reaches the main one's port while it listens ...
        code, out = _doctor(capsys, "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1",
                            "--main_process_port", str(port), "--checkpoint_dir", str(tmp_path))
        assert f"  ok  rendezvous: 127.0.0.1:{port}" in out
    # ... and not once it is closed; the fix says what to do
    code, out = _doctor(capsys, "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "127.0.0.1",
                        "--main_process_port", str(port), "--checkpoint_dir", str(tmp_path), "--timeout", "1")
    assert code == 1 and f"FAIL  rendezvous: 127.0.0.1:{port} cannot be reached from here" in out
    assert "fix: start the main machine's launch first" in out
    assert "warn  shared folder:" in out and "of 2 machines" in out
