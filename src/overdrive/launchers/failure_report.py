"""What the launcher says when workers fail: the failed ranks in the order they failed (the first cause first,
its consequences after), the end of each one's traceback or stderr, a hang's or a lost machine's summary from
the watchdog's report, and the end of the failed workers' stderr kept for the error a failed launch raises.

Everything here reads what torchelastic returns (its ``ProcessFailure`` records) and the workers' log files in
the run's log directory; nothing here starts or stops processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from overdrive.launchers import relay
from overdrive.runtime.hang_report import PEER_LOSS, REPORT_MARKER, describe_machine

#: the end of the failed workers' stderr kept for the error a failed launch raises (Accelerate's bound:
#: the last CHILD_STDERR_TAIL_CHUNKS chunks of CHILD_STDERR_CHUNK_SIZE bytes, 512 KiB)
CHILD_STDERR_CHUNK_SIZE = 8192


CHILD_STDERR_TAIL_CHUNKS = 64


#: what a script that needs Accelerate says when it is not installed: Python's import error, transformers' advice
_NO_ACCELERATE = re.compile(r"No module named 'accelerate[.']|requires `accelerate>=|requires the accelerate library")


def needs_accelerate(text: str) -> bool:
    """Whether a failed worker's output says that the script needs the ``accelerate`` package, not installed."""
    return bool(_NO_ACCELERATE.search(text))


def failures_need_accelerate(failures: Mapping[int, Any], log_dir: str) -> bool:
    """Whether any failed rank's traceback or stderr says that the script needs the ``accelerate`` package."""
    return any(needs_accelerate(_failure_text(failure, log_dir)[1]) for failure in failures.values())


def failed_stderr_tail(failures: Mapping[int, Any], log_dir: str) -> str:
    """The end of the failed ranks' stderr (first failure first), at most Accelerate's bound."""
    limit = CHILD_STDERR_CHUNK_SIZE * CHILD_STDERR_TAIL_CHUNKS
    ordered = sorted(failures.values(), key=lambda failure: _failure_time(failure, log_dir))
    texts = []
    for failure in ordered:
        path = _stderr_file(log_dir, failure.local_rank)
        if path is not None:
            texts.append(relay.stderr_text(path.read_bytes()))
    data = "".join(texts).encode(errors="replace")[-limit:]
    return data.decode(errors="replace")


def _stderr_file(log_dir: str, local_rank: int) -> Path | None:
    files = sorted(Path(log_dir).glob(f"*/attempt_*/{local_rank}/stderr.log"),
                   key=lambda p: int(p.parent.parent.name.split("_")[-1]))
    return files[-1] if files else None


_TRACEBACK = re.compile(r"^(\[rank\d+\]:\s*)?Traceback \(most recent call last\)")


#: the last line of a Python traceback: the exception's (dotted) class name, alone or before ": message"
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*)(?::\s|:?$)")


def traceback_tail(text: str, max_lines: int = 12) -> list[str]:
    """The last traceback in ``text`` (or its last lines when there is none), at most ``max_lines``."""
    lines = [line for line in text.rstrip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    tail = lines[starts[-1]:] if starts else lines
    if len(tail) > max_lines:
        tail = ["..."] + tail[-(max_lines - 1):]
    return tail


def _failure_text(failure: Any, log_dir: str) -> tuple[str, str]:
    """(what, text): the traceback from the rank's error file (torch's ``@record``), else its stderr."""
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message")
    if isinstance(message, dict):
        trace = message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
        return "traceback", str(trace)
    path = _stderr_file(log_dir, failure.local_rank)
    return "stderr", relay.stderr_text(path.read_bytes()) if path else ""


def _lost_a_peer(text: str) -> bool:
    """Whether a rank's last traceback says a collective lost its connection to another rank."""
    tail = "\n".join(traceback_tail(text, max_lines=40)).lower()
    return any(marker in tail for marker in PEER_LOSS)


def _failure_time(failure: Any, log_dir: str) -> float:
    # Without an error file torchelastic stamps every failure with the time it noticed; the stderr file's
    # last write is when that rank actually died, which tells the first failure from its consequences.
    if getattr(failure, "error_file", "<N/A>") not in ("<N/A>", "") and os.path.isfile(failure.error_file):
        return float(failure.timestamp)
    path = _stderr_file(log_dir, failure.local_rank)
    if path is not None and path.stat().st_size > 0:
        return path.stat().st_mtime
    return float(failure.timestamp)


def describe_exit(exitcode: int) -> str:
    """``exitcode`` in words: "exited with code N" or "was killed by SIGNAME"."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"ended by signal {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def describe_failures(failures: Mapping[int, Any], log_dir: str, max_restarts: int = 0,
                      shown: bool = False) -> tuple[str, int]:
    """A short report on failed ranks, first failure first, and the exit code for the command. ``shown``: the
    workers' stderr already reached the terminal, so the report names the failed rank's error rather than
    printing its traceback a second time."""
    # torchelastic lists the processes it stopped itself (SIGTERM) among the failures: they come last, and
    # so does a death by SIGUSR1 (a hang report's stack request that reached a rank as it ended): consequences.
    # So does a rank whose collective lost its connection to another rank: its error is the other's death. Times
    # alone cannot tell: a death nobody wrote down is stamped with the whole second the agent noticed it, which
    # on a loaded machine comes after the consequence's traceback.
    stopped = -int(signal.SIGTERM)
    consequence = (stopped, -int(getattr(signal, "SIGUSR1", 10)))

    def order(item: tuple[int, Any]) -> tuple[bool, bool, float, int]:
        rank, failure = item
        lost_a_peer = failure.exitcode >= 0 and _lost_a_peer(_failure_text(failure, log_dir)[1])
        return failure.exitcode in consequence, lost_a_peer, _failure_time(failure, log_dir), rank

    ordered = sorted(failures.items(), key=order)
    rank, first = ordered[0]
    restarts = f" after {max_restarts} restart{'s' if max_restarts != 1 else ''}" if max_restarts else ""
    hang = find_hang_report(log_dir)
    # a lost connection within one machine: the first failure (the rank that ended) says it best
    if hang is not None and (hang.get("cause") != "lost" or hang.get("lost_machines") or hang.get("unreachable")):
        return describe_hang(hang, failures, restarts), _exit_code(first.exitcode)
    lines = [f"overdrive launch: rank {rank} {describe_exit(first.exitcode)}{restarts}; "
             "the other processes were stopped."]
    what, text = _failure_text(first, log_dir)
    tail = traceback_tail(text)
    if tail and shown:
        error = _ERROR_LINE.match(tail[-1])
        lines.append(f"  rank {rank}'s {what} is above" + (f", ending in {error[1]}" if error else ""))
    elif tail:
        lines.append(f"  last lines of rank {rank}'s {what}:")
        lines += [f"    {line}" for line in tail]
    elif first.exitcode < 0:
        lines.append("  (a process killed by a signal leaves no traceback: look for the out-of-memory killer, "
                     "a time limit or a kill command)")
    for other, failure in ordered[1:]:
        if failure.exitcode == stopped:
            lines.append(f"  rank {other} was stopped (SIGTERM)")
        else:
            lines.append(f"  rank {other} also failed: it {describe_exit(failure.exitcode)}")
    return "\n".join(lines), _exit_code(first.exitcode)


def _exit_code(exitcode: int) -> int:
    if 0 < exitcode < 256:
        return exitcode
    return 128 - exitcode if exitcode < 0 else 1  # the shell's convention for a death by signal


def find_hang_report(log_dir: str) -> dict[str, Any] | None:
    """The hang report a worker's watchdog printed (``overdrive.runtime.watchdog``), from the stderr logs."""
    for path in sorted(Path(log_dir).glob("*/attempt_*/*/stderr.log")):
        try:
            text = relay.stderr_text(path.read_bytes())
        except OSError:
            continue
        for line in reversed(text.splitlines()):
            at = line.find(REPORT_MARKER)
            if at >= 0:
                try:
                    return json.loads(line[at + len(REPORT_MARKER):])
                except json.JSONDecodeError:
                    break
    return None


def _machine_lines(report: dict[str, Any], restarts: str) -> list[str]:
    """The summary when whole machines did not answer (lost, or behind a partition), else []."""
    collective = f"collective #{report.get('seq')} ({report.get('collective')})"
    rank = report.get("waiting_rank")
    if report.get("cause") == "lost":
        waited = f"rank {rank} lost its connection in {collective}"
        why = "lost (its processes ended, or the machine went down)"
    else:
        waited = f"rank {rank} waited {report.get('timeout_s', 0):g} s in {collective} and timed out"
        why = "unreachable (a network partition) or lost"
    if report.get("unreachable"):
        return [f"overdrive launch: {describe_machine(report['unreachable'])} cannot be reached from this machine"
                f"{restarts}: {waited}, and the job's store there does not answer (a network partition, or that "
                "machine is lost); the job was stopped here."]
    return [f"overdrive launch: {describe_machine(m)} did not answer{restarts}: {why}; {waited}; the job was "
            "stopped." for m in report.get("lost_machines") or []]


def describe_hang(report: dict[str, Any], failures: Mapping[int, Any], restarts: str) -> str:
    """The summary of a job that ended because a rank stopped joining collectives: blame that rank."""
    hung = report.get("hung_ranks") or []
    who = f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))}" if hung else "no rank could be named"
    waited = report.get("waiting_rank")
    if report.get("cause") == "stall":
        return "\n".join([f"overdrive launch: the job stalled{restarts}: no rank issued a collective for "
                          f"{report.get('timeout_s', 0):g} s (--stall_timeout); every rank's Python stack is in the "
                          "report above (overdrive: stall detected ...); the job was stopped."]
                         + [f"  rank {rank}: {describe_exit(failures[rank].exitcode)}" for rank in sorted(failures)])
    machine_lines = _machine_lines(report, restarts)
    if machine_lines:
        return "\n".join(machine_lines + [f"  rank {rank}: {describe_exit(failures[rank].exitcode)}"
                                          for rank in sorted(failures)])
    lines = [f"overdrive launch: {who} hung{restarts}: {'they' if len(hung) > 1 else 'it'} did not arrive at "
             f"collective #{report.get('seq')} ({report.get('collective')}), which rank {waited} waited "
             f"{report.get('timeout_s', 0):g} s for; the job was stopped.",
             "  every rank's Python stack is in the hang report above (overdrive: hang detected ...);",
             "  raise the limit with InitProcessGroupKwargs(timeout=...) or 'overdrive launch --timeout SECONDS' "
             "if the wait was legitimate."]
    for rank in sorted(failures):
        role = "hung" if rank in hung else "timed out waiting" if rank == waited else "stopped"
        lines.append(f"  rank {rank}: {role} ({describe_exit(failures[rank].exitcode)})")
    return "\n".join(lines)

