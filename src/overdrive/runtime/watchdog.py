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
Where overdrive made the group, the report is made in ``sys.excepthook``, after the error's own lines. On a group
made outside overdrive (adopted: Ray Train's ``TorchTrainer``, a script's own ``init_process_group``) the framework
that made it may catch the error (Ray Train catches every error of the training function), so the Accelerator's
collectives report before their error leaves overdrive (``report_before_raise``), and the error carries the
report's first lines as a note.
Ranks whose watchdog thread cannot answer (a C call holding the GIL) get SIGUSR1, which ``faulthandler``
turns into a stack dump on their stderr when they run on this machine; never a rank that has posted its exit
(``exit/<rank>``, the first thing an ending rank does), and an ending rank ignores SIGUSR1 from then on.

Across machines the store may be behind a network partition, where a silent link makes a store call wait
forever. Every store call made while a fault is reported (the claim, the answers, the exit handshake) runs
with a deadline (``CALL_DEADLINE_S``); after one misses it the store counts as unreachable and is not asked
again, so an ending rank always ends. The report then names the machine that could not be reached (its
machine rank, host name, address and ranks, from the places every rank published at start, ``pid/<rank>``).
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
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch.distributed as dist

from overdrive.runtime import hang_report as reports
from overdrive.runtime.hang_report import PEER_LOSS, REPORT_MARKER
from overdrive.runtime.torch_private import flight_recorder_dump

_ANSWER_WAIT_S = 5.0
#: the longest a store call made while reporting a fault may take before the store counts as unreachable
CALL_DEADLINE_S = 3.0
_active: Watchdog | None = None


class StoreUnreachable(TimeoutError):
    """A store call did not return within its deadline (the store's machine is behind a partition, or lost)."""


def bounded(call: Callable[[], Any], seconds: float) -> Any:
    """``call()`` in a daemon thread; its result, or ``StoreUnreachable`` when it takes over ``seconds``.

    A call that never returns (a TCP link that drops packets silently) leaves only a parked daemon thread.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="overdrive-store-call", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # the interpreter is shutting down (Python >= 3.12 starts no thread then): call directly
        return call()
    thread.join(seconds)
    if thread.is_alive():
        raise StoreUnreachable(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def local_address(peer: str) -> str:
    """The address of this machine that traffic to ``peer`` leaves from ("?" when there is no route)."""
    try:
        family, kind, _, _, where = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind) as probe:
            probe.connect(where)  # a UDP "connect" sends nothing: it only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return "?"


def is_timeout(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a process group's timeout."""
    seen = 0
    while error is not None and seen < 10:
        text = str(error).lower()
        if "timed out" in text or "timeout" in text and isinstance(error, (dist.DistError, RuntimeError)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


#: what a collective's error says when another rank's process ended (read by the launcher's report too)
def is_peer_loss(error: BaseException | None) -> bool:
    """Whether ``error`` says a collective lost its connection to another rank (that rank's process ended)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, (dist.DistError, RuntimeError)) and any(p in str(error).lower() for p in PEER_LOSS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _last_collective() -> dict[str, Any] | None:
    """The newest entry of torch's flight recorder on this rank: {"name", "seq"}; None when it is off."""
    try:
        dump = flight_recorder_dump()
        if dump is None:
            return None
        entries = pickle.loads(dump).get("entries") or []
    except Exception:  # noqa: BLE001 - the recorder is optional (off, or another torch version)
        return None
    if not entries:
        return None
    last = entries[-1]
    return {"name": str(last.get("profiling_name", "?")), "seq": int(last.get("collective_seq_id", -1))}


_TORCH_DIR = f"{os.sep}torch{os.sep}"


def _format(frames: traceback.StackSummary) -> str:
    """Stack lines, without the frames of the launcher's entry point that come before the user's script."""
    kept = list(frames)
    starts = [i for i, f in enumerate(kept) if f.filename.endswith(("overdrive/launchers/worker.py", "runpy>"))]
    if starts and starts[0] == 0:
        first = next((i for i in range(len(kept)) if i not in starts), len(kept))
        kept = kept[first:]
    lines = []
    for index, frame in enumerate(kept):  # a run of torch's own frames is shown by its first
        in_torch = _TORCH_DIR in frame.filename
        if in_torch and index and _TORCH_DIR in kept[index - 1].filename:
            continue
        lines += traceback.StackSummary.from_list([frame]).format()
        run = next((i for i in range(index + 1, len(kept)) if _TORCH_DIR not in kept[i].filename), len(kept))
        if in_torch and run - index > 1:
            lines.append(f"  ... {run - index - 1} more frames inside torch\n")
    return "".join("    " + line for line in "".join(lines).splitlines(True))


def _where_raised(error: BaseException) -> traceback.StackSummary:
    """The stack where ``error`` was raised: its traceback, after the frames that called the first of them (an
    error caught inside overdrive holds only the frames from there down, not the script's line that called)."""
    tb = error.__traceback__
    outer = traceback.extract_stack(tb.tb_frame.f_back) if tb is not None and tb.tb_frame.f_back else []
    return traceback.StackSummary.from_list([*outer, *traceback.extract_tb(tb)])


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
                 timeout: timedelta, interval: float = 1.0, node_rank: int = 0,
                 stall_timeout: float | None = None, adopted: bool = False) -> None:
        self.pg, self.rank, self.world_size = pg, rank, world_size
        self.adopted = adopted  # the group was made outside overdrive: report before the error leaves it
        self.reported = False  # this rank has reported a fault (once per process)
        self.timeout = timeout
        self.interval = interval
        self.store_address = f"{host}:{port}"
        self.unreachable = False  # a store call missed its deadline: ask the store nothing more
        self.stall_timeout = stall_timeout  # rank 0 watches for a job in which no rank issues collectives
        self._seqs_seen: tuple[int, ...] = ()
        self._changed_at = time.monotonic()
        self.exiting = False
        #: every rank's place {"pid", "host", "address", "machine"}, read by the thread once all are there
        self.places: dict[int, dict[str, Any]] = {}
        # One connection for the thread, one for the main thread (hang reports, arrivals): a store client is
        # not meant to be shared by two threads at once.
        self.store = dist.PrefixStore(f"{prefix}/watchdog", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)))
        self.main_store = dist.PrefixStore(f"{prefix}/watchdog", dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=10)))
        self.place = {"pid": os.getpid(), "host": socket.gethostname(), "address": local_address(host),
                      "machine": node_rank}
        self.main_store.set(f"pid/{rank}", json.dumps(self.place))
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
                if len(self.places) < self.world_size:
                    self._read_places()
                if not self._answered and self.store.check(["request"]):
                    self.answer(self.store, skip=threading.get_ident())
                if self.stall_timeout and self.rank == 0 and self._stalled():
                    self._report_stall()
            except Exception:  # noqa: BLE001 - the store (rank 0) is gone: the job is ending
                return

    def _stalled(self) -> bool:
        """Whether no rank's collective count changed for ``stall_timeout`` seconds (the watchdog thread)."""
        keys = [f"seq/{r}" for r in range(self.world_size)]
        if not self.store.check(keys):
            return False
        seqs = tuple(int(v) for v in self.store.multi_get(keys))
        now = time.monotonic()
        if seqs != self._seqs_seen:
            self._seqs_seen, self._changed_at = seqs, now
        if now - self._changed_at <= (self.stall_timeout or 0):
            return False
        # a rank that ended (the others finishing on their own) is not a stall
        return not any(self.store.check([f"exit/{r}"]) for r in range(self.world_size))

    def _report_stall(self) -> None:
        """Ask every rank for its stack (through the thread's own store client), print the report, end."""
        if self.store.add("claim", 1) != 1:  # another rank is reporting a timeout already
            self.stall_timeout = None
            return
        own = self._state(skip=threading.get_ident())
        self.store.set(f"answer/{self.rank}", json.dumps(own))
        self.store.set("request", str(self.rank))
        answers = {self.rank: own}
        deadline = time.monotonic() + _ANSWER_WAIT_S
        while len(answers) < self.world_size and time.monotonic() < deadline:
            for r in range(self.world_size):
                if r not in answers and self.store.check([f"answer/{r}"]):
                    answers[r] = json.loads(self.store.get(f"answer/{r}"))
            time.sleep(0.1)
        self._print(reports.stall(self.rank, self.stall_timeout or 0, answers, self.world_size, self.places))
        self.store.set("report", str(self.rank))
        os._exit(1)  # the job is hung: end it (the launcher stops the other processes and summarises)

    def _read_places(self) -> None:
        keys = [f"pid/{r}" for r in range(self.world_size)]
        if self.store.check(keys):
            self.places = {r: json.loads(value) for r, value in enumerate(self.store.multi_get(keys))}

    def call(self, method: str, *args: Any) -> Any:
        """``main_store.<method>(*args)`` with the fault-reporting deadline; ``StoreUnreachable`` after one
        call missed it (the store is not asked again: the stuck call still holds the connection)."""
        if self.unreachable:
            raise StoreUnreachable(f"the job's store at {self.store_address} did not answer before")
        try:
            return bounded(lambda: getattr(self.main_store, method)(*args), CALL_DEADLINE_S)
        except StoreUnreachable:
            self.unreachable = True
            raise
        except (RuntimeError, OSError) as exc:  # refused or reset: the store's machine is gone
            self.unreachable = True
            raise StoreUnreachable(f"{type(exc).__name__}: {exc}") from exc

    def post_exit(self) -> None:
        """Tell the other ranks this one is ending (so that none signals it), and stop taking SIGUSR1: a
        stack request that lands while the interpreter finalises would kill the process instead."""
        if self.exiting:
            return
        self.exiting = True
        _ignore_stack_requests()
        try:
            self.call("set", f"exit/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - the store may be gone or unreachable: nothing to tell
            pass

    def answer(self, store: Any, skip: int | None = None, stack: str | None = None) -> dict[str, Any]:
        """Write this rank's state (last collective, sequence number, stack) to ``store`` for the
        rank that timed out, and return it."""
        reply = self._state(skip, stack)
        store.set(f"answer/{self.rank}", json.dumps(reply))
        return reply

    def _state(self, skip: int | None = None, stack: str | None = None) -> dict[str, Any]:
        self._answered = True
        return {"rank": self.rank, "seq": self._seq(), "last": _last_collective(), "pid": os.getpid(),
                "host": socket.gethostname(), "stack": stack if stack is not None else _stacks(skip)}

    # -- the rank that timed out ---------------------------------------------------------------------
    def diagnose(self, error: BaseException, cause: str = "timeout") -> dict[str, Any] | None:
        """Report a timed-out collective: the first rank that timed out (elected through the store) collects
        every rank's answer and prints the report; the others answer and wait (a few seconds at most) until it
        is printed, so that their own end does not stop it. Every store call is bounded: when the store does
        not answer, this rank prints which machine it cannot reach instead, at once. ``cause`` is "timeout"
        or "lost" (the collective lost its connection to a rank whose process ended)."""
        self.reported = True
        own = self._state(stack=f"  thread {threading.current_thread().name} (where the timeout was raised):\n"
                                + _format(_where_raised(error)))
        try:
            first = self.call("add", "claim", 1) == 1
            self.call("set", f"answer/{self.rank}", json.dumps(own))
            if not first:
                self._wait_for_report()
                return None
            self.call("set", "request", str(self.rank))
        except StoreUnreachable:
            return self._print(reports.unreachable(self.rank, self.timeout.total_seconds(), own,
                                                   self.store_address, self.places, cause))
        answers = self._collect(own)
        seqs = {r: answers[r]["seq"] if r in answers else self._heartbeat(r) for r in range(self.world_size)}
        places = self.places or self._places_now()
        limit = reports.RAISE_ADOPTED_LIMIT if self.adopted else reports.RAISE_LIMIT
        report = self._print(reports.hang(self.rank, self.timeout.total_seconds(), own, answers, seqs, places,
                                          cause, limit))
        try:
            self.call("set", "report", str(self.rank))
        except StoreUnreachable:
            pass
        return report

    @staticmethod
    def _print(report: dict[str, Any]) -> dict[str, Any]:
        # written, not printed: Ray Train's workers replace print() with one that logs each line a second time
        summary = json.dumps({k: v for k, v in report.items() if k != "text"})
        sys.stderr.write(f"{report['text']}\n{REPORT_MARKER}{summary}\n")
        sys.stderr.flush()
        return report

    def _wait_for_report(self) -> None:
        deadline = time.monotonic() + _ANSWER_WAIT_S + 2 * CALL_DEADLINE_S
        while time.monotonic() < deadline and not self.call("check", ["report"]):
            time.sleep(0.1)

    def _places_now(self) -> dict[int, dict[str, Any]]:
        places = {}
        for r in range(self.world_size):
            try:
                if self.call("check", [f"pid/{r}"]):
                    places[r] = json.loads(self.call("get", f"pid/{r}"))
            except StoreUnreachable:
                break
        return places

    def _collect(self, own: dict[str, Any]) -> dict[int, dict[str, Any]]:
        answers = {self.rank: own}
        deadline = time.monotonic() + _ANSWER_WAIT_S
        signalled = False
        try:
            while len(answers) < self.world_size and time.monotonic() < deadline:
                for r in range(self.world_size):
                    if r not in answers and self.call("check", [f"answer/{r}"]):
                        answers[r] = json.loads(self.call("get", f"answer/{r}"))
                if not signalled and time.monotonic() > deadline - _ANSWER_WAIT_S / 2:
                    signalled = True
                    self._signal_silent(answers)
                time.sleep(0.1)
        except StoreUnreachable:
            pass
        return answers

    def _signal_silent(self, answers: dict[int, dict[str, Any]]) -> None:
        """SIGUSR1 (a faulthandler stack dump) to the silent ranks of this machine that are not ending."""
        here = socket.gethostname()
        for r in range(self.world_size):
            if r in answers or not self.call("check", [f"pid/{r}"]) or self.call("check", [f"exit/{r}"]):
                continue
            where = json.loads(self.call("get", f"pid/{r}"))
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
            return int(self.call("get", f"seq/{r}")) if self.call("check", [f"seq/{r}"]) else None
        except Exception:  # noqa: BLE001
            return None


def start(pg: Any, rank: int, world_size: int, host: str, port: int, prefix: str, timeout: timedelta,
          node_rank: int = 0, stall_timeout: float | None = None, adopted: bool = False) -> None:
    """Start this process's watchdog and the hooks that report a timed-out collective (once per process).
    ``adopted``: the group was made outside overdrive (see ``report_before_raise``)."""
    global _active
    if _active is not None:
        _active.stop()
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError):  # no SIGUSR1 (Windows) or not the main thread
        pass
    _active = Watchdog(pg, rank, world_size, host, port, prefix, timeout, node_rank=node_rank,
                       stall_timeout=stall_timeout, adopted=adopted)
    atexit.register(_mark_exit)
    previous = sys.excepthook
    if getattr(previous, "_overdrive_watchdog", False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        dog = _active
        if dog is not None:
            dog.post_exit()
        cause = _cause(error) if dog is not None and not dog.reported else None
        if dog is not None and cause:
            # the error's own line first, whatever the report does; its stack is in the report (where the
            # timeout was raised), so the report's first lines are the rank, the collective, what to do
            previous(kind, error.with_traceback(None), None)
            error.with_traceback(tb)
        else:
            previous(kind, error, tb)
        if dog is not None and cause:
            try:
                dog.diagnose(error, cause)
            except Exception as exc:  # noqa: BLE001 - the error is printed already; the report is extra
                print(f"overdrive: the hang report failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    vars(hook)["_overdrive_watchdog"] = True  # a mark on the function object
    sys.excepthook = hook


def _cause(error: BaseException) -> str | None:
    """"timeout" or "lost" when ``error`` is a collective's timeout or lost connection, else None."""
    return "timeout" if is_timeout(error) else "lost" if is_peer_loss(error) else None


def report_before_raise(error: BaseException) -> None:
    """On an adopted group, report a collective's timeout or lost connection now, before ``error`` leaves
    overdrive, and add the report's first lines to ``error`` as a note: the framework that made the group may
    catch the error (Ray Train does, and shows its traceback, notes included), so ``sys.excepthook`` never
    sees it. Nothing where overdrive made the group (its excepthook reports after the error's own lines), for
    another error, or once this rank has reported."""
    dog = _active
    cause = _cause(error) if dog is not None and dog.adopted and not dog.reported else None
    if dog is None or cause is None:
        return
    dog.post_exit()  # the group is broken: this rank is ending, do not ask it for a stack dump
    try:
        report = dog.diagnose(error, cause)
    except Exception as exc:  # noqa: BLE001 - the error goes on; the report is extra
        print(f"overdrive: the hang report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    if report is not None:  # the first lines; the stacks stay in the report
        lines = [line for line in report["text"].splitlines() if line.startswith("overdrive:")]
        note = "\n".join([*lines, f"overdrive: every rank's stack: the hang report on rank {dog.rank}'s stderr"])
        add_note = getattr(error, "add_note", None)  # Python 3.11 and later show notes with the traceback
        if add_note is not None:
            add_note(note)


def active() -> Watchdog | None:
    """This process's watchdog, if its process group was created by overdrive."""
    return _active


def _ignore_stack_requests() -> None:
    """From now on SIGUSR1 does nothing here: faulthandler's own exit would otherwise put the default
    action (end the process) back while the interpreter finalises. Only the main thread can set a signal's
    action; elsewhere (an Accelerator made in Ray Train's training thread) faulthandler keeps answering."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    except (AttributeError, ValueError, RuntimeError, OSError):  # no SIGUSR1, or not the main thread
        pass


def _mark_exit() -> None:
    """At exit: tell the other ranks this one ended on purpose (bounded: the store may be unreachable), then
    stop the watchdog thread and wait for it. A daemon thread still inside a store call when the interpreter
    shuts down aborts the whole process when the call returns ("terminate called without an active
    exception"), after a successful run."""
    if _active is not None:
        _active.post_exit()
        _active.stop()
        _active.join(timeout=2.0)


def stop() -> None:
    """Stop this process's watchdog thread (the process group is being destroyed)."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None
