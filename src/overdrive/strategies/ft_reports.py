"""What fault-tolerant training prints (``--ft_lighthouse``): each replica group's first process says when a group
is lost, joins, is sent the training state or heals, with the quorum's size, the time and the bytes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from overdrive.resolve import FaultTolerantSettings


def _size(num_bytes: int) -> str:
    """A byte count for people: ``812 B``, ``12.4 kB``, ``3.10 MB``, ``1.25 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes} B"


class ReportingClient:
    """torchft's manager client, passed through; each quorum's answer is handed to ``on_quorum`` as well. In a
    group of one process (``alone``), the commit is that process's own answer: asking the group's manager
    server, a round trip that only gathers the group's answers, is skipped."""

    def __init__(self, client: Any, on_quorum: Callable[[Any], None], alone: bool = False) -> None:
        self._client, self._on_quorum, self._alone = client, on_quorum, alone

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: Any) -> bool:
        """Whether every process of the group may commit ``step``: this process's own answer when it is the
        group's only one, otherwise the group's manager server's."""
        if self._alone:
            return should_commit
        return self._client.should_commit(group_rank, step, should_commit, timeout=timeout)

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        result = self._client._quorum(*args, **kwargs)
        self._on_quorum(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class UnevenReplicaGroups(ValueError):
    """The replica groups of a quorum were launched with different numbers of processes."""


def replica_name(host: str, processes: int, group: int) -> str:
    """A replica group's id for torchft: ``HOST_PROCESSES_GROUP`` (torchft reads the group from its trailing
    digits; the processes let every group check the others')."""
    return f"{host}_{processes}_{group}"


def _member(replica_id: str) -> tuple[str, str, int]:
    """``(group, machine, processes)`` of a quorum member's id (``HOST_PROCESSES_GROUP:UUID``)."""
    host, processes, group = replica_id.split(":")[0].rsplit("_", 2)
    return group, host, int(processes)


class QuorumReports:
    """The lines a replica group prints (its first process only) as groups leave, join and heal."""

    def __init__(self, settings: FaultTolerantSettings, speaks: bool, processes: int) -> None:
        self.settings, self.speaks, self.processes = settings, speaks, processes
        #: the quorums seen so far
        self.quorums = 0
        self.members: list[str] = []
        self.heal_source: str | None = None
        self.received_bytes: int | None = None

    def _say(self, text: str) -> None:
        if self.speaks:
            print(f"overdrive: {text}", file=sys.stderr, flush=True)

    def on_quorum(self, result: Any) -> None:
        """A quorum was answered (torchft's quorum thread). Groups of different sizes end every group here: the
        average pairs each process with the processes of the same rank in the other groups."""
        members = list(result.replica_ids)
        size = len(members)
        if members != self.members:
            uneven = [member for member in map(_member, members) if member[2] != self.processes]
            if uneven:
                others = ", ".join(f"group {group} (machine {host}) has {n}" for group, host, n in uneven)
                raise UnevenReplicaGroups(
                    f"overdrive: the replica groups of fault-tolerant training must have the same number of processes: "
                    f"this one (group {self.settings.replica_group}) has {self.processes}, {others}; launch every "
                    "group with the same --num_processes")
        if self.quorums == 0:
            self._say(f"fault-tolerant training through {self.settings.lighthouse}: replica group "
                      f"{self.settings.replica_group} of {self.settings.num_replica_groups}, {size} group(s) in "
                      f"the first quorum (step {result.max_step})")
        for gone in (m for m in self.members if m not in members):
            group, host, _ = _member(gone)
            self._say(f"replica group {group} (machine {host}) was lost; the quorum is now {size} group(s) at "
                      f"step {result.max_step}, training goes on")
        if self.quorums:
            for new in (m for m in members if m not in self.members):
                group, host, _ = _member(new)
                self._say(f"replica group {group} (machine {host}) joined; the quorum is now {size} group(s) at "
                          f"step {result.max_step}")
        if result.heal and result.recover_src_replica_rank is not None:
            self.heal_source = members[result.recover_src_replica_rank] if result.recover_src_replica_rank < size \
                else str(result.recover_src_replica_rank)
        for dst in result.recover_dst_replica_ranks:
            group, host, _ = _member(members[dst]) if dst < size else (str(dst), "?", 0)
            self._say(f"sending the training state to replica group {group} (machine {host}), which heals at "
                      f"step {result.max_step}")
        self.members, self.quorums = members, self.quorums + 1

    def after_quorum(self, seconds: float) -> None:
        """The quorum (and a heal) is done, in ``seconds``."""
        if self.received_bytes is not None and self.heal_source is not None:
            group, host, _ = _member(self.heal_source)
            self._say(f"healed from replica group {group} (machine {host}) in {seconds:.2f} s: "
                      f"{_size(self.received_bytes)} of weights, optimizer and scheduler states received "
                      "(no checkpoint read)")
        self.received_bytes = self.heal_source = None

    def dropped(self, step: int) -> None:
        """A step was not committed (a group was lost during it): its batch is dropped."""
        self._say(f"step {step} was not committed (a replica group was lost during it): its batch is dropped, "
                  "the optimizer and the scheduler did not step")
