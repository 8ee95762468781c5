"""Where checkpoints go: automatic names, the newest complete one, ``total_limit``, and the atomic rename.

A checkpoint is written into a hidden sibling folder ``.<name>.tmp-<token>`` and becomes visible under
its name by one ``os.replace`` once every process has finished; its ``manifest.json`` is written last.
So a folder under a checkpoint's name is complete, a hidden temporary folder never is, and a process
killed mid-save leaves the previous checkpoints as they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import warnings
from pathlib import Path

from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.storage import MANIFEST, fsync_dir
from overdrive.config import ProjectConfiguration
from overdrive.runtime.cluster import detect_process_info

PREFIX = "checkpoint_"
_NUMBERED = re.compile(rf"^{PREFIX}(\d+)$")
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old|del|pub)-(?P<token>[0-9a-f]+)$")
#: The file in a save's temporary folder that says which process owns it (removed just before publishing).
OWNER_FILE = ".owner.json"
#: A temporary folder without a live owner on this machine is only deleted once nothing in it changed for
#: this long (its owner may run on another machine that shares the folder).
STALE_AFTER_S = 24 * 3600.0


def checkpoints_root(project: ProjectConfiguration) -> Path:
    """``<project_dir>/checkpoints``, where automatically named checkpoints live."""
    if not project.project_dir:
        raise ValueError("automatic checkpoint naming needs a project folder: pass Accelerator(project_dir=...) "
                         "or ProjectConfiguration(project_dir=...)")
    return Path(project.project_dir) / "checkpoints"


def save_target(project: ProjectConfiguration, output_dir: str | os.PathLike | None) -> Path:
    """The folder ``save_state(output_dir)`` writes."""
    problems = project.problems() if hasattr(project, "problems") else []
    if problems:  # the settings may have been changed after construction: check before anything is written
        raise ValueError("save_state(): the project configuration is not valid: " + "; ".join(problems))
    if project.automatic_checkpoint_naming:
        if output_dir is not None:
            warnings.warn(f"save_state(output_dir={str(output_dir)!r}) is ignored with automatic_checkpoint_naming; "
                          f"the checkpoint goes to {checkpoints_root(project)}", stacklevel=3)
        target = checkpoints_root(project) / f"{PREFIX}{project.iteration}"
        if target.exists():
            raise CheckpointError(
                f"{target} already exists: automatic naming never overwrites a checkpoint. Set "
                "accelerator.project_configuration.iteration to the next free number (load_state() restores it "
                "from the newest checkpoint), or delete the folder")
        return target
    if output_dir is None:
        raise ValueError("save_state() needs output_dir, unless ProjectConfiguration(automatic_checkpoint_naming=True) "
                         "names the checkpoints")
    target = Path(output_dir)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"save_state(output_dir={str(target)!r}): that path is a file, not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST).is_file():
        raise CheckpointError(
            f"save_state(output_dir={str(target)!r}): the folder holds files but is not an overdrive checkpoint; "
            "a save replaces the whole folder, so it refuses to delete them. Choose another folder or empty it")
    return target


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete ``checkpoint_<n>`` folders of ``root`` (those with a manifest), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _NUMBERED.match(entry.name)
        if match and entry.is_dir() and (entry / MANIFEST).is_file():
            found.append((int(match.group(1)), entry))
    return [path for _, path in sorted(found)]


def newest_checkpoint(project: ProjectConfiguration) -> Path:
    """The newest complete checkpoint under the project's checkpoints folder."""
    root = checkpoints_root(project)
    found = complete_checkpoints(root)
    if not found:
        hidden = sorted(p.name for p in root.iterdir() if _TEMPORARY.match(p.name)) if root.is_dir() else []
        extra = f" (only unfinished saves: {', '.join(hidden)})" if hidden else ""
        raise CheckpointError(f"load_state() found no complete checkpoint in {root}{extra}; pass the folder to "
                              "load_state(input_dir), or save one first")
    return found[-1]


def explain_missing(target: Path) -> str:
    """Why ``target`` may be missing: an interrupted overwrite leaves the old copy beside it."""
    parent = target.parent
    if not parent.is_dir():
        return ""
    aside = sorted(p for p in parent.iterdir() if (m := _TEMPORARY.match(p.name)) and m["name"] == target.name
                   and m["kind"] == "old" and (p / MANIFEST).is_file())
    if aside:
        return (f"; a save that was replacing it was interrupted, and the previous checkpoint is intact at "
                f"{aside[-1]}: rename it to {target.name} to use it")
    return ""


def temporary_path(target: Path, token: str) -> Path:
    """The hidden folder beside ``target`` that a save with ``token`` writes into before the rename."""
    return target.parent / f".{target.name}.tmp-{token}"


def _owner(token: str) -> dict[str, object]:
    """This process as the owner of a save: host, pid, and the job's run id and restart attempt (a later
    attempt of the same job proves that every process of an earlier one has ended, on any machine)."""
    try:
        info = detect_process_info()
        run_id, attempt = info.run_id, info.restart_count
    except ValueError:  # malformed variables: the job is refused elsewhere; no claim on other machines
        run_id, attempt = "", 0
    return {"token": token, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
            "run_id": run_id, "attempt": attempt}


def claim(temporary: Path, token: str) -> None:
    """Create ``temporary`` with an owner file naming this process (host, pid, token, job attempt)."""
    temporary.mkdir(parents=True, exist_ok=True)
    (temporary / OWNER_FILE).write_text(json.dumps(_owner(token)))


def publishing_record(target: Path, token: str) -> Path:
    """The file beside ``target`` naming the process that is renaming folders for the save ``token``: while
    it exists, ``.<name>.old-<token>`` and ``.<name>.tmp-<token>`` belong to that process (or to a crash)."""
    return target.parent / f".{target.name}.pub-{token}"


def release(temporary: Path) -> None:
    """Remove the owner file (the folder is complete and about to be published)."""
    (temporary / OWNER_FILE).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _newest_change(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for path in folder.rglob("*"):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            pass
    return max(times)


def _read_owner(entry: Path) -> dict | None:
    """The owner of a leftover: its own owner file, else the publishing record of its token."""
    match = _TEMPORARY.match(entry.name)
    records = [entry] if match and match["kind"] == "pub" else [entry / OWNER_FILE]
    if match:
        records.append(entry.parent / f".{match['name']}.pub-{match['token']}")
    for record in records:
        try:
            owner = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict):
            return owner
    return None


def owner_ended(owner: dict) -> bool | None:
    """Whether the owner process has ended: on this machine its pid tells; on any machine, a later attempt
    of the same job (torchelastic restarts the whole group) proves it. None when it cannot be told."""
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        return not _pid_alive(owner["pid"])
    if owner.get("run_id"):
        try:
            info = detect_process_info()
        except ValueError:
            return None
        if info.run_id == owner["run_id"] and isinstance(owner.get("attempt"), int):
            return True if owner["attempt"] < info.restart_count else None
    return None


def is_stale(entry: Path, now: float | None = None) -> bool:
    """Whether the leftover ``entry`` provably belongs to no running save: its owner (see
    :func:`owner_ended`) has ended, or, owner unknown, nothing in it changed for ``STALE_AFTER_S``."""
    now = time.time() if now is None else now
    owner = _read_owner(entry)
    ended = owner_ended(owner) if owner is not None else None
    if ended is not None:
        return ended
    try:
        return now - _newest_change(entry) > STALE_AFTER_S
    except OSError:
        return False


def clean_temporaries(parent: Path, keep_token: str, name: str | None = None) -> list[Path]:
    """Delete the leftovers of interrupted saves of checkpoint ``name`` in ``parent`` (all names when None);
    never those of the save ``keep_token``, nor any that another save may still be writing (see
    :func:`is_stale`), so jobs saving into sibling folders of one parent leave each other alone.

    An ``.old`` copy is kept when its checkpoint is missing: it is then the only copy left (else it goes
    once its save is over: the checkpoint that replaced it is in place). ``.del`` folders (checkpoints that
    ``total_limit`` was deleting) always go; a publishing record (``.pub``) goes with its owner.
    """
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    # publishing records last: the folders of their token are judged by them
    for entry in sorted(parent.iterdir(), key=lambda p: p.name.rsplit("-", 1)[0].endswith(".pub")):
        match = _TEMPORARY.match(entry.name)
        if not match or match["token"] == keep_token or (name is not None and match["name"] != name):
            continue
        if match["kind"] == "old" and not (parent / match["name"]).exists():
            continue
        if match["kind"] in ("tmp", "pub") and not is_stale(entry):
            continue
        if match["kind"] == "old" and _read_owner(entry) is not None and not is_stale(entry):
            continue  # a live save between its two renames
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def publish(temporary: Path, target: Path, token: str) -> None:
    """Make the finished ``temporary`` folder visible as ``target``, replacing an older ``target``.

    The old folder is first moved aside by a rename, so at every moment one complete copy exists
    (under its name or beside it, see :func:`explain_missing`); it is deleted once the new one is in.
    """
    aside = target.parent / f".{target.name}.old-{token}"
    record = publishing_record(target, token)
    record.write_text(json.dumps(_owner(token)))  # who owns the two folders until the renames are done
    if target.exists():
        os.replace(target, aside)
    try:
        os.replace(temporary, target)
    except OSError:
        if aside.exists() and not target.exists():
            os.replace(aside, target)  # put the old checkpoint back
        raise
    fsync_dir(target.parent)
    if aside.exists():
        shutil.rmtree(aside, ignore_errors=True)
    record.unlink(missing_ok=True)
    # leftovers of an earlier save of this name that crashed between its renames: now that a complete
    # checkpoint has the name again, its old copy and its unpublished one can go once their owner has ended
    clean_temporaries(target.parent, token, target.name)


def prune(root: Path, total_limit: int | None, keep: Path) -> list[Path]:
    """Delete the oldest complete checkpoints of ``root`` beyond ``total_limit`` (never ``keep``)."""
    if total_limit is None or total_limit <= 0:
        return []
    found = complete_checkpoints(root)
    removed = []
    for path in found[: max(len(found) - total_limit, 0)]:
        if path.resolve() == keep.resolve():
            continue
        # Rename first: a half-deleted folder must not look like a complete checkpoint.
        doomed = path.parent / f".{path.name}.del-{os.urandom(4).hex()}"
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path)
    return removed
