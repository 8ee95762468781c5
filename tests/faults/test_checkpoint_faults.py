"""Checkpoint faults in one process (or two independent jobs): saves that cannot collide, stale leftovers,
crafted metadata, bad settings. The multi-process and kill cases are in test_checkpoint_faults_distributed."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from overdrive import Accelerator, ProjectConfiguration
from overdrive.checkpoint import CheckpointError, naming
from overdrive.checkpoint.storage import checksum
from overdrive.training.state import GradientState
from tests.faults.faultkit import SCRIPTS, clean_env


@pytest.fixture(autouse=True)
def _fresh_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def _accelerator(**project):
    accelerator = Accelerator(project_config=ProjectConfiguration(**project)) if project else Accelerator()
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return accelerator, model, optimizer


@pytest.mark.timeout(120)
def test_two_jobs_saving_into_sibling_folders_both_succeed(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    env = clean_env(tmp_path)
    jobs = [subprocess.Popen([sys.executable, str(SCRIPTS / "save_loop.py"), str(runs / name), "12"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("A", "B")]
    outputs = [job.communicate(timeout=110) for job in jobs]
    for job, (out, err) in zip(jobs, outputs):
        assert job.returncode == 0 and out.strip() == "OK", err[-3000:]
    assert sorted(p.name for p in runs.iterdir()) == ["A", "B"]  # no leftovers either


def test_a_live_save_in_progress_is_never_cleaned_and_a_dead_ones_is(tmp_path):
    accelerator, *_ = _accelerator()
    root = tmp_path / "runs"
    live = root / ".A.tmp-aaaa"  # another process (this one, alive) writing checkpoint A
    naming.claim(live, "aaaa")
    dead_owner = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                text=True).stdout.strip()
    dead = root / ".A.tmp-bbbb"  # a save killed earlier on this machine: its pid has ended
    dead.mkdir(parents=True)
    (dead / naming.OWNER_FILE).write_text(json.dumps({"token": "bbbb", "host": os.uname().nodename,
                                                      "pid": int(dead_owner)}))
    unknown = root / ".A.tmp-cccc"  # no owner file, recently changed: maybe another machine's save
    unknown.mkdir()
    sibling = root / ".B.tmp-dddd"  # B's save: not A's business, even when stale
    sibling.mkdir()
    accelerator.save_state(root / "A")
    assert live.is_dir() and unknown.is_dir() and sibling.is_dir() and not dead.exists()
    assert (root / "A" / "manifest.json").is_file() and not (root / "A" / naming.OWNER_FILE).exists()
    os.utime(unknown, (0, 0))  # untouched for longer than STALE_AFTER_S
    accelerator.save_state(root / "A")
    assert not unknown.exists() and live.is_dir() and sibling.is_dir()


def test_crafted_metadata_pointing_outside_the_folder_is_refused(tmp_path):
    accelerator, model, _ = _accelerator()
    other = Path(accelerator.save_state(tmp_path / "other", layout="resharding"))
    target = Path(accelerator.save_state(tmp_path / "ckpt", layout="resharding"))
    metadata_path = target / ".metadata"
    metadata = pickle.loads(metadata_path.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = f"../{other.name}/{info.relative_path}"
    metadata_path.write_bytes(pickle.dumps(metadata))
    manifest = json.loads((target / "manifest.json").read_text())  # the attacker fixes the manifest too
    manifest["files"][".metadata"].update(size=metadata_path.stat().st_size, crc32=checksum(metadata_path))
    (target / "manifest.json").write_text(json.dumps(manifest))
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    changed = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match=r"is stored in '\.\./other/__0_\d\.distcp', which is outside"):
        accelerator.load_state(target)
    assert all(torch.equal(a, b) for a, b in zip(changed, model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("limit", ["x", 2.5, 0, -1, True])
def test_total_limit_is_checked_when_the_configuration_is_built(limit):
    with pytest.raises(ValueError, match=rf"total_limit={limit!r} is not valid"):
        ProjectConfiguration(total_limit=limit)


def test_total_limit_changed_later_fails_before_anything_is_written(tmp_path):
    accelerator, *_ = _accelerator(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator.project_configuration.total_limit = "x"
    with pytest.raises(ValueError, match="total_limit='x' is not valid"):
        accelerator.save_state()
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
    accelerator.project_configuration.total_limit = 1
    first = accelerator.save_state()
    second = accelerator.save_state()  # the next save works and the limit applies
    assert not Path(first).exists() and Path(second).is_dir()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs (needs root); skipped where it cannot be mounted."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode(errors='replace').strip()})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _big_run():
    accelerator = Accelerator()
    model = torch.nn.Linear(512, 1024)  # 2 MiB of weights, 6 MiB with AdamW's two states
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    return accelerator


def test_disk_full_is_named_before_writing_with_where_and_how_much(tiny_disk):
    accelerator = _big_run()
    small = _accelerator()[0]
    small.save_state(tiny_disk / "ckpt")  # a first checkpoint fits
    with pytest.raises(CheckpointError) as caught:
        accelerator.save_state(tiny_disk / "ckpt")
    message = str(caught.value)
    assert "the disk is full" in message and str(tiny_disk) in message
    assert "needs about 7.0 MiB" in message and "MiB free" in message
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["ckpt"]  # the earlier one intact, no leftovers
    small.load_state(tiny_disk / "ckpt")


def test_disk_that_fills_during_the_write_is_named_too(tiny_disk, monkeypatch):
    from overdrive.checkpoint import space

    accelerator = _big_run()
    monkeypatch.setattr(space, "free_bytes", lambda folder: 1 << 40)  # the check before writing is fooled
    with pytest.raises(CheckpointError) as caught:
        accelerator.save_state(tiny_disk / "ckpt")
    message = str(caught.value)
    assert "the disk is full" in message and str(tiny_disk) in message, message
    assert "unexpected pos" not in message
    assert list(tiny_disk.iterdir()) == []


def test_disk_full_without_a_tmpfs(tmp_path, monkeypatch):
    from overdrive.checkpoint import space

    accelerator = _big_run()
    monkeypatch.setattr(space, "free_bytes", lambda folder: 3 << 20)
    with pytest.raises(CheckpointError, match=r"the disk is full: .* needs about 7\.0 MiB .* has 3\.0 MiB free"):
        accelerator.save_state(tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_load_of_a_file_says_what_is_wrong(tmp_path):
    accelerator, *_ = _accelerator()
    folder = Path(accelerator.save_state(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match=r"that path is a file, not a checkpoint folder; .* e\.g\. "):
        accelerator.load_state(folder / "manifest.json")


def test_the_same_optimizer_prepared_twice_is_registered_once(tmp_path):
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model, first = accelerator.prepare(model, optimizer)
    second = accelerator.prepare(optimizer)
    assert second is first and accelerator.prepare(first) is first
    assert len(accelerator._optimizers) == 1
    model(torch.randn(2, 4)).sum().backward()
    first.step()
    folder = Path(accelerator.save_state(tmp_path / "ckpt"))
    assert json.loads((folder / "manifest.json").read_text())["contents"]["optimizers"] == 1
    accelerator.load_state(folder)


def _run_crash_publish(tmp_path: Path, folder: Path, value: float, *mode: str, **env: str) -> int:
    script = SCRIPTS / "crash_publish.py"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                                                        "TORCHELASTIC", "GROUP_RANK"))}
    result = subprocess.run([sys.executable, str(script), str(folder), str(value), *mode],
                            env={**clean, "TMPDIR": str(tmp_path), **env}, capture_output=True, text=True,
                            timeout=120)
    return result.returncode


@pytest.mark.timeout(300)
def test_leftovers_of_a_save_that_crashed_between_its_renames_are_cleaned_by_the_next(tmp_path):
    folder = tmp_path / "ck"
    assert _run_crash_publish(tmp_path, folder, 1.0) == 0
    assert _run_crash_publish(tmp_path, folder, 2.0, "crash") == 9
    # the crash: the old checkpoint aside, the new one complete but unpublished, nothing under the name
    left = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir() if p.name.startswith(".ck."))
    assert not folder.exists() and {".ck.old", ".ck.tmp"} <= set(left), left
    assert _run_crash_publish(tmp_path, folder, 3.0) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".ck", "ck"))) == ["ck"]
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    accelerator.load_state(folder)  # the new checkpoint, complete
    assert all(torch.equal(p, torch.full_like(p, 3.0)) for p in accelerator.unwrap_model(model).parameters())


def test_a_leftover_of_another_machine_is_stale_once_its_job_restarted(tmp_path, monkeypatch):
    leftover = tmp_path / ".ck.tmp-abcd"
    leftover.mkdir()
    owner = {"token": "abcd", "host": "another-machine", "pid": 1, "run_id": "job7", "attempt": 0}
    (tmp_path / ".ck.pub-abcd").write_text(json.dumps(owner))  # it crashed between its renames, elsewhere
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "job7"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # the same attempt: that process may be running
    assert not naming.is_stale(leftover) and not naming.is_stale(tmp_path / ".ck.pub-abcd")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job8")  # another job: unknown, recently changed
    assert not naming.is_stale(leftover)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a later attempt: every earlier process has ended
    assert naming.is_stale(leftover) and naming.is_stale(tmp_path / ".ck.pub-abcd")
    assert sorted(p.name for p in naming.clean_temporaries(tmp_path, "ffff", "ck")) == [".ck.pub-abcd",
                                                                                       ".ck.tmp-abcd"]
