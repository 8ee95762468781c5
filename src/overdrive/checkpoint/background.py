"""``save_state(async_save=True)``: the training loop waits only while the state is copied to host memory.

DCP's ``async_save`` stages (copies) the tensors and returns; its writes and its metadata exchange go on
in a thread. A second thread here waits for them and then publishes the checkpoint as a synchronous save
does (checksums, manifest, atomic rename, ``total_limit``). Both threads talk over a gloo group of their
own, so their collectives never interleave with the training loop's. Until the rename the files sit in the
hidden temporary folder, so a process killed during the background write leaves the previous checkpoint
as it was. The next ``save_state`` / ``load_state``, ``end_training()`` and the end of the interpreter
wait for the pending save (a failure is raised there). The host copy is kept between saves (one copy of
the state in host memory), so staging is a copy, not an allocation.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import Group, run_dcp

_pending: PendingSave | None = None
_process_group: Any = None


class PendingSave:
    """A save whose files are still being written; ``wait()`` returns the folder once it is published."""

    def __init__(self, target: Path, work: Callable[[], None]) -> None:
        self.target = target
        self.error: BaseException | None = None
        # Not a daemon: the interpreter waits for it at exit, so a script that ends right after an async
        # save still publishes it.
        self._thread = threading.Thread(target=self._run, args=(work,), name="overdrive-async-save")
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread by wait()
            self.error = exc

    def done(self) -> bool:
        """Whether the background write has finished (published or failed); does not block."""
        return not self._thread.is_alive()

    def wait(self) -> str:
        """Block until the save is published and return its folder.

        Raises the exception the background thread met (a ``CheckpointError`` for a failed write), so
        a failure surfaces in the training loop at the next save, load or ``end_training()``."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return str(self.target)


class _ReusedBuffers(BlockingAsyncStager):
    """Stages into host buffers kept from one save to the next (allocated again only when the state's
    keys, shapes or dtypes change): a copy, without allocating and faulting in a second state each time.
    The next save waits for the previous one, so the buffers are free again when reused."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=False)
        self._layout: tuple | None = None
        self._buffers: dict[str, Any] = {}

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        layout = tuple((k, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (k, type(v).__name__)
                       for k, v in state_dict.items())
        if layout != self._layout or any(isinstance(v, torch.Tensor) and v.is_cuda for v in state_dict.values()):
            self._buffers = {k: torch.empty_like(v, device="cpu") for k, v in state_dict.items()
                             if isinstance(v, torch.Tensor) and not hasattr(v, "_local_tensor")}  # not DTensors
            self._layout = layout
        staged: dict[str, Any] = {}
        for key, value in state_dict.items():
            buffer = self._buffers.get(key)
            if buffer is not None:
                staged[key] = buffer.copy_(value.detach())
            else:  # DTensors and other values: DCP's own staging
                staged[key] = _create_and_copy(value)
        return staged


def _create_and_copy(value: Any) -> Any:
    from torch.distributed.checkpoint.staging import _copy_state_dict, _create_cpu_state_dict

    box = {"v": value}
    staged = _create_cpu_state_dict(box)
    _copy_state_dict(box, staged)
    return staged["v"]


_stager: _ReusedBuffers | None = None


def _checkpoint_group(group: Group) -> Group:
    """The gloo group the background threads use (created once, by every rank: a save is collective)."""
    global _process_group
    if not group.active:
        return group
    if _process_group is None:
        _process_group = dist.new_group(backend="gloo")
    return Group(_process_group)


def start(flat: dict[str, Any], writer: Any, planner: Any, group: Group, target: Path, temporary: Path,
          leader: bool, needed: int, publish: Callable[[Group, Any], None]) -> PendingSave:
    """Stage ``flat`` (blocking: the copy to host memory), then write and ``publish`` in the background."""
    global _pending, _stager
    background = _checkpoint_group(group)
    _stager = _stager or _ReusedBuffers()
    response = run_dcp(lambda: dcp.async_save(flat, storage_writer=writer, planner=planner, async_stager=_stager,
                                              process_group=background.pg, no_dist=not group.active),
                       writes=(temporary, needed))
    # torch < 2.7 returns the upload's future itself, later versions an AsyncSaveResponse holding it
    upload: Future[Any] = response if isinstance(response, Future) else response.upload_completion

    def finish() -> None:
        try:
            metadata = run_dcp(upload.result, writes=(temporary, needed))
            publish(background, metadata)
        except BaseException as exc:
            if leader:
                shutil.rmtree(temporary, ignore_errors=True)
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"save_state({str(target)!r}, async_save=True) did not finish in the background "
                                  f"({type(exc).__name__}: {exc}); nothing was published and earlier checkpoints "
                                  "are untouched") from exc

    _pending = PendingSave(target, finish)
    return _pending


def wait_for_pending_save() -> str | None:
    """Block until the last ``save_state(async_save=True)`` is published; return its folder (None if there
    was none). Raises the background save's error."""
    global _pending
    pending, _pending = _pending, None
    return pending.wait() if pending is not None else None
