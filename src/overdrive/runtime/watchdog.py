"""Hang reports: when a collective times out, name the rank that did not arrive and show every rank's stack.

A collective that one rank never joins makes the others wait until the process-group timeout, and the
rank that times out is the one that *waited*. To blame the right one, each rank runs a small watchdog
thread with its own connection to the job's TCP store:

- every ``interval`` seconds it publishes how many collectives this rank has issued (the process group's
  sequence number) under ``seq/<rank>``;
- it answers a hang request (``request``) with its sequence number, the last collective torch's flight
  recorder saw on this rank (name and sequence id; gloo records them too) and the Python stack of every
  thread of the process.

The rank whose collective timed out (the first one, elected with ``claim``) posts the request, waits a few
seconds for the answers, and prints one report to stderr: the collective and its sequence number, the
ranks that did not arrive (fewer collectives issued than the waiting rank), and every rank's stack. The
last line, ``overdrive-hang-report: {json}``, is what ``overdrive launch`` reads to blame the hung rank.
Ranks whose watchdog thread cannot answer (a C call holding the GIL) get SIGUSR1, which ``faulthandler``
turns into a stack dump on their stderr when they run on this machine.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch.distributed as dist

REPORT_MARKER = "overdrive-hang-report: "
_ANSWER_WAIT_S = 5.0
_active: Watchdog | None = None


def is_timeout(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a process group's timeout."""
    seen = 0
    while error is not None and seen < 10:
        text = str(error).lower()
        if "timed out" in text or "timeout" in text and isinstance(error, (dist.DistError, RuntimeError)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _last_collective() -> dict[str, Any] | None:
    """The newest entry of torch's flight recorder on this rank: {"name", "seq"}; None when it is off."""
    try:
        # private and missing from torch's stubs, present at run time (torch >= 2.5)
        from torch._C._distributed_c10d import _dump_fr_trace  # pyright: ignore[reportAttributeAccessIssue]

        entries = pickle.loads(_dump_fr_trace()).get("entries") or []
    except Exception:  # noqa: BLE001 - the recorder is optional (off, or another torch version)
        return None
    if not entries:
        return None
    last = entries[-1]
    return {"name": str(last.get("profiling_name", "?")), "seq": int(last.get("collective_seq_id", -1))}


def _format(frames: traceback.StackSummary) -> str:
    """Stack lines, without the frames of the launcher's entry point that come before the user's script."""
    kept = list(frames)
    starts = [i for i, f in enumerate(kept) if f.filename.endswith(("overdrive/launchers/worker.py", "runpy>"))]
    if starts and starts[0] == 0:
        first = next((i for i in range(len(kept)) if i not in starts), len(kept))
        kept = kept[first:]
    return "".join("    " + line for line in "".join(traceback.StackSummary.from_list(kept).format())
                   .splitlines(True))


def _stacks(skip: int | None = None) -> str:
    """The Python stack of every thread of this process (not the thread ``skip``)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        parts.append(f"  thread {names.get(ident, ident)}:\n" + _format(traceback.extract_stack(frame)))
    return "\n".join(parts)


class Watchdog:
    """The per-rank thread that publishes progress and answers hang requests (see the module docstring)."""

    def __init__(self, pg: Any, rank: int, world_size: int, host: str, port: int, prefix: str,
                 timeout: timedelta, interval: float = 1.0) -> None:
        self.pg, self.rank, self.world_size = pg, rank, world_size
        self.timeout = timeout
        self.interval = interval
        # One connection for the thread, one for the main thread (hang reports, arrivals): a store client is
        # not meant to be shared by two threads at once.
        self.store = dist.PrefixStore(f"{prefix}/watchdog", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)))
        self.main_store = dist.PrefixStore(f"{prefix}/watchdog", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)))
        self.main_store.set(f"pid/{rank}", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        self._stop = threading.Event()
        self._answered = False
        self._thread = threading.Thread(target=self._loop, name="overdrive-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the process group is closing)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end (after ``stop``)."""
        self._thread.join(timeout)

    def _seq(self) -> int:
        try:
            return int(self.pg._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - the group may be gone
            return -1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store.set(f"seq/{self.rank}", str(self._seq()))
                if not self._answered and self.store.check(["request"]):
                    self.answer(self.store, skip=threading.get_ident())
            except Exception:  # noqa: BLE001 - the store (rank 0) is gone: the job is ending
                return

    def answer(self, store: Any, skip: int | None = None, stack: str | None = None) -> dict[str, Any]:
        """Write this rank's state (last collective, sequence number, stack) to ``store`` for the
        rank that timed out, and return it."""
        self._answered = True
        reply = {"rank": self.rank, "seq": self._seq(), "last": _last_collective(), "pid": os.getpid(),
                 "host": socket.gethostname(), "stack": stack if stack is not None else _stacks(skip)}
        store.set(f"answer/{self.rank}", json.dumps(reply))
        return reply

    # -- the rank that timed out ---------------------------------------------------------------------
    def diagnose(self, error: BaseException) -> dict[str, Any] | None:
        """Collect every rank's answer and print the report (on the first rank that timed out only)."""
        if self.main_store.add("claim", 1) != 1:
            return None
        own = self.answer(self.main_store, skip=threading.get_ident(),
                          stack="  thread MainThread (where the timeout was raised):\n"
                                + _format(traceback.extract_tb(error.__traceback__)))
        self.main_store.set("request", str(self.rank))
        answers = self._collect(own)
        report = self._report(own, answers)
        print(report["text"], file=sys.stderr, flush=True)
        print(REPORT_MARKER + json.dumps({k: v for k, v in report.items() if k != "text"}), file=sys.stderr,
              flush=True)
        return report

    def _collect(self, own: dict[str, Any]) -> dict[int, dict[str, Any]]:
        answers = {self.rank: own}
        deadline = time.monotonic() + _ANSWER_WAIT_S
        signalled = False
        while len(answers) < self.world_size and time.monotonic() < deadline:
            for r in range(self.world_size):
                if r not in answers and self.main_store.check([f"answer/{r}"]):
                    answers[r] = json.loads(self.main_store.get(f"answer/{r}"))
            if not signalled and time.monotonic() > deadline - _ANSWER_WAIT_S / 2:
                signalled = True
                self._signal_silent(answers)
            time.sleep(0.1)
        return answers

    def _signal_silent(self, answers: dict[int, dict[str, Any]]) -> None:
        """SIGUSR1 (a faulthandler stack dump) to the silent ranks of this machine."""
        here = socket.gethostname()
        for r in range(self.world_size):
            if r in answers or not self.main_store.check([f"pid/{r}"]):
                continue
            where = json.loads(self.main_store.get(f"pid/{r}"))
            if where["host"] == here:
                try:
                    os.kill(int(where["pid"]), signal.SIGUSR1)
                except OSError:
                    pass

    def arrive(self, what: str, number: int, poll: float = 0.05) -> None:
        """Wait until every rank reached call ``number`` of ``what`` (through the store, no collective).

        Raises ``RuntimeError`` naming the ranks that will not come: they went on to other collectives
        (more issued than this rank), ended, or did not arrive within the process-group timeout.
        """
        self.main_store.set(f"arrive/{what}/{number}/{self.rank}", "1")
        mine = self._seq()
        deadline = time.monotonic() + self.timeout.total_seconds()
        since: dict[int, float] = {}  # when each missing rank was first seen ahead of this one
        while True:
            missing = [r for r in range(self.world_size)
                       if not self.main_store.check([f"arrive/{what}/{number}/{r}"])]
            if not missing:
                return
            now = time.monotonic()
            ahead = {r for r in missing if (self._heartbeat(r) or -1) > mine}
            since = {r: since.get(r, now) for r in ahead}
            # ahead for two heartbeats and still not here: it is in other collectives, not on its way
            moved_on = [r for r in sorted(ahead) if now - since[r] > 2.5 * self.interval]
            ended = [r for r in missing if self.main_store.check([f"exit/{r}"])]
            if moved_on or ended or now > deadline:
                self.main_store.delete_key(f"arrive/{what}/{number}/{self.rank}")  # this call did not happen
                why = ("went on to other collectives instead" if moved_on else "ended" if ended
                       else f"did not arrive within {self.timeout.total_seconds():g} s")
                ranks = moved_on or ended or missing
                raise RuntimeError(f"{what}() was called on rank {self.rank}, but rank"
                                   f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {why}")
            time.sleep(poll)

    def _heartbeat(self, r: int) -> int | None:
        try:
            return int(self.main_store.get(f"seq/{r}")) if self.main_store.check([f"seq/{r}"]) else None
        except Exception:  # noqa: BLE001
            return None

    def _report(self, own: dict[str, Any], answers: dict[int, dict[str, Any]]) -> dict[str, Any]:
        seqs = {r: answers[r]["seq"] if r in answers else self._heartbeat(r) for r in range(self.world_size)}
        mine = own["seq"]
        behind = [r for r, s in seqs.items() if s is not None and s < mine]
        silent = [r for r in range(self.world_size) if r not in answers]
        hung = behind or silent
        last = own.get("last") or {}
        name = last.get("name", "a collective")
        seq = last.get("seq", mine)
        seconds = self.timeout.total_seconds()
        lines = [f"overdrive: hang detected: rank {self.rank} waited {seconds:g} s in collective #{seq} ({name}) "
                 f"and timed out; " + (f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} did not "
                                       "arrive" if hung else "no rank is behind (a mismatched collective?)") + "."]
        for r in range(self.world_size):
            answer = answers.get(r)
            at = f"issued {seqs[r]} collectives" if seqs[r] is not None else "sent no heartbeat"
            rlast = (answer or {}).get("last") or {}
            doing = f", last #{rlast['seq']} {rlast['name']}" if rlast else ""
            tag = " <- did not arrive" if r in hung else ""
            lines.append(f"-- rank {r}: {at}{doing}{tag}")
            lines.append(answer["stack"] if answer else "  (no answer: its stack, if any, is in its own stderr)")
        return {"text": "\n".join(lines), "waiting_rank": self.rank, "hung_ranks": hung, "collective": name,
                "seq": seq, "timeout_s": seconds, "seqs": {str(r): s for r, s in seqs.items()}}


def start(pg: Any, rank: int, world_size: int, host: str, port: int, prefix: str, timeout: timedelta) -> None:
    """Start this process's watchdog and the hooks that report a timed-out collective (once per process)."""
    global _active
    if _active is not None:
        _active.stop()
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError):  # no SIGUSR1 (Windows) or not the main thread
        pass
    _active = Watchdog(pg, rank, world_size, host, port, prefix, timeout)
    atexit.register(_mark_exit)
    previous = sys.excepthook
    if getattr(previous, "_overdrive_watchdog", False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if _active is not None and is_timeout(error):
            try:
                _active.diagnose(error)
            except Exception as exc:  # noqa: BLE001 - never hide the original error
                print(f"overdrive: the hang report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        previous(kind, error, tb)

    vars(hook)["_overdrive_watchdog"] = True  # a mark on the function object
    sys.excepthook = hook


def active() -> Watchdog | None:
    """This process's watchdog, if its process group was created by overdrive."""
    return _active


def _mark_exit() -> None:
    """At exit: tell the other ranks this one ended on purpose, then stop the watchdog thread and wait for it.
    A daemon thread still inside a store call when the interpreter shuts down aborts the whole process when
    the call returns ("terminate called without an active exception"), after a successful run."""
    if _active is not None:
        try:
            _active.main_store.set(f"exit/{_active.rank}", "1")
        except Exception:  # noqa: BLE001 - the store may be gone already
            pass
        _active.stop()
        _active.join(timeout=2.0)


def stop() -> None:
    """Stop this process's watchdog thread (the process group is being destroyed)."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None
