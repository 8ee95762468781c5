"""Start a script on N machines x M processes through torchrun's own machinery, in this process.

``launch_script`` turns a ``LaunchPlan`` into torchrun's command line, parses it with torchrun's own
parser (``torch.distributed.run.get_args_parser``) and runs it with ``torch.distributed.run.run``: the
elastic agent starts, watches and restarts the workers; nothing here manages processes. The resolved
settings reach every worker as one JSON value in ``OVERDRIVE_LAUNCH_CONFIG``.

Each worker's stderr goes to a file in the run's log directory (torchrun's ``--redirects 2``) and is
copied to this process's stderr as it is written, so that when a rank fails the launcher can show the
end of its traceback next to its rank and exit code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from overdrive.launchers import relay
from overdrive.launchers.protocol import LAUNCH_CONFIG_VAR, LAUNCHER_PID_VAR, encode_launch_config

#: the end of the failed workers' stderr kept for the error a failed launch raises (Accelerate's bound:
#: the last CHILD_STDERR_TAIL_CHUNKS chunks of CHILD_STDERR_CHUNK_SIZE bytes, 512 KiB)
CHILD_STDERR_CHUNK_SIZE = 8192
CHILD_STDERR_TAIL_CHUNKS = 64
_last_failure = {"stderr": ""}


def last_failure_stderr() -> str:
    """The end of the failed workers' stderr (first failure first) of this process's last launch that failed
    (at most ``CHILD_STDERR_CHUNK_SIZE * CHILD_STDERR_TAIL_CHUNKS`` bytes); "" after a launch that did not."""
    return _last_failure["stderr"]


class LaunchError(RuntimeError):
    """Processes started by a launcher failed; ``exit_code`` is what the launching command returns."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``overdrive launch`` decided: how many processes where, and what the workers are told."""

    num_processes: int  # in all, over every machine (Accelerate's meaning; elastic: with num_machines machines)
    num_machines: int = 1  # elastic: the most machines
    min_machines: int = -1  # elastic (``--num_machines MIN:MAX``): the fewest machines; -1: num_machines
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_conf: str = ""
    rdzv_id: str = "none"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    num_cpu_threads_per_process: int | None = None
    visible_devices: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES for gpu_ids
    worker_config: dict[str, Any] = field(default_factory=dict)
    log_dir: str | None = None
    tee: str | None = None
    role: str = "default"
    debug: bool = False
    quiet: bool = False

    @property
    def processes_per_machine(self) -> int:
        """The processes torchrun starts on each machine."""
        return self.num_processes // self.num_machines

    def __post_init__(self) -> None:
        if self.min_machines == -1:
            object.__setattr__(self, "min_machines", self.num_machines)


@dataclass(frozen=True)
class Command:
    """What each worker runs: a script (or ``-m`` module, or a program with ``--no_python``) and its args."""

    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    #: run the target with ``import accelerate`` giving overdrive (``overdrive launch --as_accelerate``)
    as_accelerate: bool = False


def default_threads(local_processes: int) -> int:
    """CPU threads per process when none are asked for: this machine's cores shared out, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(cores // max(local_processes, 1), 1)


def torchrun_argv(plan: LaunchPlan, command: Command, log_dir: str) -> list[str]:
    """torchrun's command line for ``plan`` (what ``torchrun ...`` would be given)."""
    nodes = f"{plan.min_machines}:{plan.num_machines}" if plan.min_machines != plan.num_machines else plan.num_machines
    argv = [f"--nnodes={nodes}", f"--nproc-per-node={plan.processes_per_machine}",
            f"--max-restarts={plan.max_restarts}", f"--monitor-interval={plan.monitor_interval}",
            f"--role={plan.role}", f"--log-dir={log_dir}"]
    if plan.num_machines > 1 or plan.main_process_port:
        addr, port = plan.main_process_ip or "127.0.0.1", plan.main_process_port or 29500
        if plan.rdzv_backend == "static":
            argv += [f"--master-addr={addr}", f"--master-port={port}", f"--node-rank={plan.machine_rank}"]
        else:
            argv += [f"--rdzv-backend={plan.rdzv_backend}", f"--rdzv-endpoint={addr}:{port}", f"--rdzv-id={plan.rdzv_id}"]
    # (one machine and no port: torchrun itself picks a free port for a c10d store on localhost)
    if plan.rdzv_conf:
        argv.append(f"--rdzv-conf={plan.rdzv_conf}")
    if plan.tee:
        argv.append(f"--tee={plan.tee}")
    else:
        argv.append("--redirects=2")  # stderr to a file, which StderrCopier shows as it is written
    # Every worker starts in overdrive's small entry point, which ties it to this process (it dies with the
    # launcher) and arms faulthandler for hang reports, then runs the target as python would.
    kind = "program" if command.no_python else "module" if command.module else "script"
    entry = "overdrive.compat.worker" if command.as_accelerate else "overdrive.launchers.worker"
    return argv + ["--no-python", sys.executable, "-u", "-m", entry, kind, command.target, *command.args]


def patched_environ(values: Mapping[str, str | None]) -> contextlib.AbstractContextManager[None]:
    """Set (or with None, remove) environment variables for the block; the workers inherit them."""
    from overdrive.helpers.misc import patch_environment

    return patch_environment(**values)


def worker_environ(plan: LaunchPlan) -> dict[str, str | None]:
    """The variables every worker gets besides torchrun's own: the config JSON, threads, devices."""
    local = plan.processes_per_machine
    threads = plan.num_cpu_threads_per_process
    env: dict[str, str | None] = {LAUNCH_CONFIG_VAR: encode_launch_config(plan.worker_config),
                                  LAUNCHER_PID_VAR: str(os.getpid())}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(default_threads(local))
    if plan.debug:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if not plan.tee:  # stderr goes to a file the launcher copies: stdout joins it, in order (relay.py)
        env[relay.FRAMED_STDOUT_VAR] = "1"
    env.update(plan.visible_devices)
    if plan.rdzv_backend in ("etcd", "etcd-v2") and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        # the shared store's address stays that of the first round on a machine whose rank stays above 0 (lost
        # with its machine); unshared, each round's rank 0 publishes a new one (the agent reads this variable)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if plan.worker_config.get("ft_lighthouse") and "RUST_LOG" not in os.environ and not plan.debug:
        env["RUST_LOG"] = "warn"  # torchft logs every quorum and commit at its default level (shown with --debug)
    # what Accelerate's launcher exports, for libraries that read it themselves (transformers' TrainingArguments)
    from overdrive.config.accelerate_env import variables_for_workers

    env.update(variables_for_workers(plan.worker_config))
    return env


@contextmanager
def quiet_torchelastic(debug: bool) -> Iterator[None]:
    """torchelastic logs every start, every SIGTERM it sends and every failure in a long block; the
    launchers report failures themselves, so only ``debug`` shows those lines (levels restored after)."""
    prefixes = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher",
                "torch.multiprocessing")
    # torchelastic sets a level on each module's own logger ("Received 2 death signal" on Ctrl-C came from
    # one), so the parents' level alone does not quiet them
    names = [*prefixes, *(name for name in logging.root.manager.loggerDict if name.startswith(prefixes))]
    saved = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


class RestartReporter(logging.Handler):
    """One line on stderr each time torchrun's agent forms the worker group again (a restart after a failure,
    or an elastic job's new membership), with the machines and processes it now has. Reads the agent's
    "Rendezvous complete" log record (``torch.distributed.elastic.agent.server.api``), which quiet mode hides."""

    LOGGER = "torch.distributed.elastic.agent.server.api"

    def __init__(self, max_restarts: int) -> None:
        super().__init__(logging.INFO)
        self.max_restarts = max_restarts
        self.first: tuple[int, int] | None = None  # (machines, processes) of the first group

    def emit(self, record: logging.LogRecord) -> None:
        """Report a rendezvous after the first."""
        found: Any = record.args
        if not isinstance(found, Mapping) or "group_world_size" not in found:
            return
        sizes = found.get("global_world_sizes") or [0]
        now = (int(found["group_world_size"]), int(sizes[0]))
        if self.first is None:
            self.first = now
            return
        restart = int(found.get("restart_count") or 0)
        why = f"restart {restart} of {self.max_restarts}" if restart else "the machines taking part changed"
        before = f" (before: {self.first[0]} machines, {self.first[1]} processes)" if now != self.first else ""
        print(f"overdrive launch: the workers started again ({why}) with {now[0]} machine{'s' if now[0] != 1 else ''}, "
              f"{now[1]} processes in all{before}", file=sys.stderr, flush=True)

    @classmethod
    @contextmanager
    def attached(cls, plan: LaunchPlan) -> Iterator[None]:
        """Report restarts during the block (inside ``quiet_torchelastic``; levels restored after)."""
        agent = logging.getLogger(cls.LOGGER)
        saved = agent.level, agent.propagate
        reporter = cls(plan.max_restarts)
        agent.setLevel(logging.INFO)
        agent.propagate = plan.debug  # quiet: the agent's own lines stay hidden
        agent.addHandler(reporter)
        try:
            yield
        finally:
            agent.removeHandler(reporter)
            agent.setLevel(saved[0])
            agent.propagate = saved[1]


def launch_script(plan: LaunchPlan, command: Command) -> int:
    """Run ``command`` as ``plan`` says; return the exit code (0, or the first failed rank's)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    # A directory of this run's own, also inside --log_dir, so that no earlier run's logs are shown or reported.
    if plan.log_dir:
        os.makedirs(plan.log_dir, exist_ok=True)
    log_dir = tempfile.mkdtemp(prefix="overdrive-launch-", dir=plan.log_dir)
    if not plan.log_dir:
        start_reaper(log_dir)  # removes the folder even if this process is killed outright
    argv = torchrun_argv(plan, command, log_dir)
    if plan.debug:
        print("overdrive launch: torchrun " + " ".join(argv), file=sys.stderr, flush=True)
    args = torchrun.get_args_parser().parse_args(argv)
    copier = StderrCopier(log_dir) if not plan.tee else None
    _last_failure["stderr"] = ""
    try:
        with patched_environ(worker_environ(plan)), quiet_torchelastic(plan.debug), RestartReporter.attached(plan):
            if copier:
                copier.start()
            torchrun.run(args)
        return 0
    except ChildFailedError as err:
        _stop(copier)  # the workers' last stderr lines first, then the report
        _last_failure["stderr"] = failed_stderr_tail(err.failures, log_dir)
        report, code = describe_failures(err.failures, log_dir, plan.max_restarts, shown=True)
        print(report, file=sys.stderr, flush=True)
        if not command.as_accelerate and not command.no_python and any(
                needs_accelerate(_failure_text(failure, log_dir)[1]) for failure in err.failures.values()):
            print("overdrive launch: the script needs Accelerate, which is not installed here: add --as_accelerate "
                  "to run it on overdrive (overdrive launch --as_accelerate ...)", file=sys.stderr, flush=True)
        return code
    except (SignalException, KeyboardInterrupt) as err:
        _stop(copier)
        sigval = int(getattr(err, "sigval", signal.SIGINT))
        stop_descendants()  # torchelastic stopped the workers' process groups; not what left them
        print(f"overdrive launch: stopped by {signal.Signals(sigval).name}; the workers were stopped",
              file=sys.stderr, flush=True)
        return 128 + sigval
    except RendezvousError as err:
        _stop(copier)
        where = f"{plan.main_process_ip}:{plan.main_process_port or 29500}"
        print(f"overdrive launch: the machines did not meet at {where} ({type(err).__name__}: {err}); "
              f"check --main_process_ip, --main_process_port and that all {plan.num_machines} machines started",
              file=sys.stderr, flush=True)
        return 1
    except (RuntimeError, OSError, ValueError) as err:
        _stop(copier)
        if plan.debug and not plan.quiet:  # --quiet: the error without the launcher's traceback, as Accelerate
            raise
        # e.g. DistNetworkError: the port is taken, or the main machine cannot be reached
        port = f" (main_process_port {plan.main_process_port})" if plan.main_process_port else ""
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        missing = describe_missing_machines(plan, first)
        print(f"overdrive launch: {missing}" if missing else
              f"overdrive launch: torchrun could not start the processes{port}: {type(err).__name__}: {first} "
              "(--debug shows the whole traceback)", file=sys.stderr, flush=True)
        return 1
    finally:
        _stop(copier)
        if not plan.log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


#: what a script that needs Accelerate says when it is not installed: Python's import error, transformers' advice
_NO_ACCELERATE = re.compile(r"No module named 'accelerate[.']|requires `accelerate>=|requires the accelerate library")


def needs_accelerate(text: str) -> bool:
    """Whether a failed worker's output says that the script needs the ``accelerate`` package, not installed."""
    return bool(_NO_ACCELERATE.search(text))


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


def stop_descendants(grace_s: float = 5.0) -> list[int]:
    """End every process this launch started that is still running, wherever it went: a worker's children
    in a session of their own escape torchelastic, which stops the workers' process groups. They are found
    by the launcher's pid the workers inherited (``OVERDRIVE_LAUNCHER_PID``): SIGTERM, then after
    ``grace_s`` SIGKILL. Returns the pids it signalled (Linux; elsewhere none are found)."""
    import time

    marker = f"{LAUNCHER_PID_VAR}={os.getpid()}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if int(entry.name) != os.getpid() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # ended meanwhile, or another user's
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        alive = [pid for pid in found if _signal(pid, sig)]
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _running(pid)]
        if not alive:
            break
    return found


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def describe_missing_machines(plan: LaunchPlan, error: str) -> str | None:
    """The machines that did not join (or could not be reached) when the static rendezvous failed, from
    torchrun's error text; None for another error."""
    where = f"{plan.main_process_ip}:{plan.main_process_port or 29500}"
    joined = re.search(r"(\d+)/(\d+) clients joined", error)
    if joined and plan.machine_rank == 0:
        came, wanted = int(joined[1]), int(joined[2])
        others = list(range(1, plan.num_machines))
        who = (f"machine {others[0]}" if len(others) == 1 else
               f"{wanted - came} of machines {', '.join(map(str, others))}")
        return (f"{who} did not join the job at {where} ({came} of {wanted} machines came within the rendezvous "
                f"timeout: {error}); start 'overdrive launch --machine_rank R ...' on every machine, with "
                f"--main_process_ip {plan.main_process_ip} reachable from each (check with 'overdrive doctor')")
    if plan.machine_rank != 0 and re.search(r"(timed out|timeout|refused|unreachable)", error, re.I):
        return (f"machine 0 could not be reached at {where} from machine {plan.machine_rank} ({error}); start "
                "machine 0's 'overdrive launch --machine_rank 0 ...', and check --main_process_ip / "
                "--main_process_port and the network between the machines ('overdrive doctor')")
    return None


_REAPER = """
import os, shutil, sys, time
pid, folder = int(sys.argv[1]), sys.argv[2]
def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
while alive():
    time.sleep(0.2)
shutil.rmtree(folder, ignore_errors=True)
"""


def start_reaper(folder: str) -> None:
    """A tiny process of its own session that deletes ``folder`` once this process has ended, however."""
    import subprocess

    subprocess.Popen([sys.executable, "-S", "-c", _REAPER, str(os.getpid()), folder], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(copier: StderrCopier | None) -> None:
    if copier is not None:
        copier.stop()


# -- worker stderr: shown as written, kept for the failure report -----------------------------------------
class StderrCopier:
    """Copy each worker's ``stderr.log`` (every attempt) to our stderr as it grows, bytes unchanged."""

    def __init__(self, log_dir: str, interval: float = 0.05) -> None:
        self._root = Path(log_dir)
        self._interval = interval
        self._offsets: dict[Path, int] = {}
        self._left: dict[Path, bytes] = {}  # an incomplete stdout record, per file
        self._files: list[Path] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="overdrive-stderr", daemon=True)

    def start(self) -> None:
        """Start copying in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop copying and wait for the thread."""
        if not self._done.is_set():
            self._done.set()
            # no time limit: a thread still copying (slow output on a loaded machine) would race the last copy
            # below for the same files, and lines came out late, or out of order
            self._thread.join()
            self._copy()
            for left in self._left.values():  # what the workers left unfinished (killed while writing)
                if left:
                    _write(sys.stderr, left)

    def _loop(self) -> None:
        rounds = 0
        while not self._done.wait(self._interval):
            rounds += 1
            # Looking for new files (a restart's attempt folder) walks the tree: once a second is enough;
            # reading the known files every interval keeps the output prompt.
            self._copy(rescan=rounds % 20 == 1)

    def _copy(self, rescan: bool = True) -> None:
        if rescan or not self._files:
            self._files = sorted(self._root.glob("*/attempt_*/*/stderr.log"))
        for path in self._files:
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < offset:  # written again from the start: a restart that
                        offset, self._left[path] = 0, b""  # counts none (machines joined or left) reuses the folder
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            if data:
                self._offsets[path] = offset + len(data)
                # the worker's stdout records come back out to stdout, in the order written (launchers/relay.py)
                pieces, self._left[path] = relay.split(self._left.get(path, b"") + data)
                for is_stdout, piece in pieces:
                    _write(sys.stdout if is_stdout else sys.stderr, piece)


def _write(stream: TextIO, data: bytes) -> None:
    """``data`` to ``stream`` (its bytes unchanged where it has a buffer), flushed."""
    out = getattr(stream, "buffer", None)
    if out is not None:
        stream.flush()
        out.write(data)
        out.flush()
    else:
        stream.write(data.decode(errors="replace"))
        stream.flush()


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
    from overdrive.runtime.watchdog import PEER_LOSS

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
    from overdrive.runtime.watchdog import REPORT_MARKER

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
    from overdrive.runtime.hang_report import describe_machine

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
