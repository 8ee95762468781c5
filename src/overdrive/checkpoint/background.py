"""``save_state(async_save=True)``: the training loop waits only while the state is copied to host memory.

The call copies every tensor into host buffers kept from one save to the next (a copy, no allocation: the
next save waits for the previous one, so the buffers are free again) and returns. A background thread then
runs DCP's save of that copy (what ``torch.distributed.checkpoint.async_save`` runs in its thread, without
its per-save executor, logging and staging wrappers on the caller's side), fsyncs the JSON files and
publishes the checkpoint as a synchronous save does (manifest, atomic rename, ``total_limit``). Its
collectives run over a gloo group of its own, so they never interleave with the training loop's. Until the
rename the files sit in the hidden temporary folder, so a process killed during the background write leaves
the previous checkpoint as it was. The next ``save_state`` / ``load_state``, ``end_training()`` and the end
of the interpreter wait for the pending save (a failure is raised there).
"""

from __future__ import annotations

import ctypes
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.group import Group, run_dcp
from overdrive.runtime.torch_private import staged_cpu_copy

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


class _ReusedBuffers:
    """Host copies of a state dict's tensors, kept from one save to the next (allocated again only when the
    state's keys, shapes or dtypes change): staging is a copy, without allocating and faulting in a second
    state each time. The next save waits for the previous one, so the buffers are free again when reused."""

    def __init__(self) -> None:
        self._layout: list[tuple[Any, ...]] | None = None
        self._buffers: dict[str, torch.Tensor] = {}

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` whose tensors live in the reused buffers (DTensors and containers are
        copied by DCP's own staging; numbers, strings and None are immutable and kept as they are).

        Tensors on an accelerator are copied into pinned buffers without blocking, then waited for once."""
        layout = [(k, v.shape, v.dtype, v.device.type) if isinstance(v, torch.Tensor) else (k,)
                  for k, v in state_dict.items()]
        if layout != self._layout:
            self._buffers = {k: torch.empty_like(v, device="cpu", pin_memory=v.device.type != "cpu")
                             for k, v in state_dict.items()
                             if isinstance(v, torch.Tensor) and not hasattr(v, "_local_tensor")}  # not DTensors
            self._layout = layout
        staged: dict[str, Any] = {}
        buffers = self._buffers
        devices: set[torch.device] = set()
        plain: list[tuple[torch.Tensor, torch.Tensor]] = []  # contiguous CPU tensors: copied by _copy_all
        with torch.no_grad():  # a copy out of a parameter is not part of any graph
            for key, value in state_dict.items():
                buffer = buffers.get(key)
                if buffer is not None:
                    if value.device.type != "cpu":
                        buffer.copy_(value, non_blocking=True)
                        devices.add(value.device)
                    elif value.is_contiguous() and buffer.is_contiguous():
                        plain.append((value, buffer))
                    else:
                        buffer.copy_(value)
                    staged[key] = buffer
                elif _immutable(value):
                    staged[key] = value
                else:
                    staged[key] = _create_and_copy(value)
            _copy_all(plain)
        for device in devices:  # the copies must be in host memory before the training loop goes on
            getattr(torch, device.type).synchronize(device)
        return staged


def _immutable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str)) or (
        type(value) is tuple and all(_immutable(v) for v in value))


#: Bytes one copy task moves: small enough to share the work out evenly between the copying threads.
_COPY_CHUNK = 8 << 20
_copiers: ThreadPoolExecutor | None = None


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each contiguous CPU ``(source, buffer)`` pair: memmove of 8 MiB chunks that this thread and up to
    3 more (no more than torch's thread count) take from one list until it is empty. torch's own copy runs
    one parallel region per tensor, whose threads wait for each other at its end, which a busy machine makes
    slower (docs/benchmarks.md)."""
    global _copiers
    chunks = []
    for source, buffer in pairs:
        size, to, start = source.numel() * source.element_size(), buffer.data_ptr(), source.data_ptr()
        chunks += [(to + offset, start + offset, min(_COPY_CHUNK, size - offset))
                   for offset in range(0, size, _COPY_CHUNK)]
    helpers = min(3, torch.get_num_threads() - 1, len(chunks) - 1)
    pending = iter(chunks)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                chunk = next(pending, None)
            if chunk is None:
                return
            ctypes.memmove(*chunk)  # releases the GIL

    if helpers <= 0:
        work()
        return
    _copiers = _copiers or ThreadPoolExecutor(max_workers=3, thread_name_prefix="overdrive-stage")
    others = [_copiers.submit(work) for _ in range(helpers)]
    work()
    for other in others:
        other.result()


def _create_and_copy(value: Any) -> Any:
    return staged_cpu_copy(value)


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
    staged = _stager.stage(flat)

    def finish() -> None:
        try:
            metadata = run_dcp(lambda: dcp.save(staged, storage_writer=writer, planner=planner,
                                                process_group=background.pg, no_dist=not group.active),
                               writes=(temporary, needed))
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
