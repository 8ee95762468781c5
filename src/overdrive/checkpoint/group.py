"""The few collectives a save or a load needs, and errors raised alike on every process."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from overdrive.checkpoint.errors import CheckpointError
from overdrive.checkpoint.space import disk_full_message, is_disk_full
from overdrive.runtime import group as process_group
from overdrive.runtime import watchdog

T = TypeVar("T")
_calls: dict[str, int] = {}  # per process: how many saves / loads it started, to meet the other ranks'


class Group:
    """The default process group as a save or a load uses it (every call is a no-op in one process)."""

    def __init__(self, pg: Any = None) -> None:
        self.pg = pg  # None: the default group
        self.active = process_group.is_distributed()
        self.rank = process_group.rank() if self.active else 0
        self.size = process_group.world_size() if self.active else 1

    @classmethod
    def alone(cls) -> Group:
        """This process on its own, every collective a no-op: a save that only the main process calls."""
        group = cls.__new__(cls)
        group.pg, group.active, group.rank, group.size = None, False, 0, 1
        return group

    def arrive(self, what: str) -> None:
        """Check that every rank called ``what`` before its first collective: a save or load called on one
        rank (``if accelerator.is_main_process: accelerator.save_state(...)``) fails here, clearly, instead
        of pairing its collectives with whatever the other ranks do next (a gloo abort)."""
        if not self.active:
            return

        dog = watchdog.active()
        if dog is None:  # a process group overdrive did not create: no store of ours to meet in
            return
        number = _calls[what] = _calls.get(what, 0) + 1
        try:
            dog.arrive(what, number)
        except RuntimeError as exc:
            _calls[what] = number - 1  # the next call is the one the other ranks will make
            raise CheckpointError(
                f"{exc}. Every process must call {what}(), as in Accelerate: call it outside "
                "`if accelerator.is_main_process:` (the main process alone writes the shared files anyway). "
                "Nothing was written or changed") from None

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (``[value]`` in one process); collective."""
        if not self.active:
            return [value]
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, value, group=self.pg)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if not self.active:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank of the group gets here (a no-op in one process)."""
        if self.active:
            dist.barrier(group=self.pg)

    def check(self, error: BaseException | None, what: str) -> None:
        """Raise on every rank if ``what`` failed on any: one collective, so call it on every rank."""
        if not self.active:
            if error is not None:
                raise error
            return
        reports = self.gather(None if error is None else _describe(error))
        failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
        if not failed:
            return
        message = "; ".join(f"rank {rank}: {report}" for rank, report in failed)
        raise CheckpointError(f"{what}: {message}") from (error if isinstance(error, Exception) else None)

    def run_on_main(self, function: Callable[[], T], what: str) -> T:
        """``function()`` run by rank 0 alone; its result (or its error) reaches every rank."""
        result, error = None, None
        if self.rank == 0:
            try:
                result = function()
            except Exception as exc:  # noqa: BLE001 - reported on every rank below
                error = exc
        if not self.active and error is not None:
            raise error
        result, report = self.broadcast((result, None if error is None else _describe(error)))
        if report is not None:
            if error is not None:
                raise error
            raise CheckpointError(f"{what}: {report}")
        return result


def _describe(error: BaseException) -> str:
    if isinstance(error, CheckpointError):
        return str(error)
    if isinstance(error, CheckpointException):
        return dcp_failure(error)
    return f"{type(error).__name__}: {error}"


def dcp_failure(error: CheckpointException) -> str:
    """The first cause inside DCP's exception, which otherwise prints every rank's traceback."""
    for rank, failure in sorted(error.failures.items()):
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, CheckpointError):
            return str(cause)
        return f"rank {rank}: {type(cause).__name__}: {cause}"
    return str(error)


def run_dcp(function: Callable[[], T], writes: tuple[Any, int] | None = None) -> T:
    """Run a DCP save or load, raising :class:`CheckpointError` (an ``Exception``) instead of DCP's
    ``CheckpointException`` (a ``BaseException``, which ``except Exception`` does not catch).

    ``writes``: (folder, bytes needed) of a save, so that a full disk is reported as one."""
    try:
        with warnings.catch_warnings():
            # DCP warns that it "assumes the intent" whenever there is no process group: we meant it.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            return function()
    except CheckpointException as exc:
        if writes is not None and is_disk_full(exc):
            raise CheckpointError(disk_full_message(*writes)) from None
        raise CheckpointError(dcp_failure(exc)) from None
    except OSError as exc:
        if writes is not None and is_disk_full(exc):
            raise CheckpointError(disk_full_message(*writes)) from None
        raise
