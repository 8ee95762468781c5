"""Start a script on N machines x M processes through torchrun's own machinery, in this process.

``launch_script`` turns a ``LaunchPlan`` into torchrun's command line, parses it with torchrun's own
parser (``torch.distributed.run.get_args_parser``) and runs it with ``torch.distributed.run.run``: the
elastic agent starts, watches and restarts the workers; nothing here manages processes. The resolved
settings reach every worker as one JSON value in ``OVERDRIVE_LAUNCH_CONFIG``.

Each worker's stderr goes to a file in the run's log directory (torchrun's ``--redirects 2``) and is
copied to this process's stderr as it is written (``stderr_copier.py``), so that when a rank fails the launcher
can show the end of its traceback next to its rank and exit code (``failure_report.py``). What a launch leaves
behind, a worker's children in a session of their own and the log folder, is ended by ``process_tree.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from overdrive.helpers.environment import patch_environment
from overdrive.launchers import relay
from overdrive.launchers.accelerate_variables import variables_for_workers
from overdrive.launchers.failure_report import describe_failures, failed_stderr_tail, failures_need_accelerate
from overdrive.launchers.launch_plan import Command, LaunchPlan, default_threads
from overdrive.launchers.process_tree import start_reaper, stop_descendants
from overdrive.launchers.protocol import (
    AS_ACCELERATE_VAR,
    LAUNCH_CONFIG_VAR,
    LAUNCHER_PID_VAR,
    encode_launch_config,
)
from overdrive.launchers.stderr_copier import StderrCopier

#: the module every worker starts in (``python -m``): it ties the worker to the launcher, then runs the target
WORKER_ENTRY = "overdrive.launchers.worker"
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
    return argv + ["--no-python", sys.executable, "-u", "-m", WORKER_ENTRY, kind, command.target, *command.args]


def patched_environ(values: Mapping[str, str | None]) -> contextlib.AbstractContextManager[None]:
    """Set (or with None, remove) environment variables for the block; the workers inherit them."""
    return patch_environment(**values)


def worker_environ(plan: LaunchPlan, command: Command | None = None) -> dict[str, str | None]:
    """The variables every worker gets besides torchrun's own: the config JSON, threads, devices, and whether
    ``import accelerate`` gives overdrive (``command.as_accelerate``)."""
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
    if command is not None and command.as_accelerate:
        env[AS_ACCELERATE_VAR] = "1"
    if plan.rdzv_backend in ("etcd", "etcd-v2") and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        # the shared store's address stays that of the first round on a machine whose rank stays above 0 (lost
        # with its machine); unshared, each round's rank 0 publishes a new one (the agent reads this variable)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if plan.worker_config.get("ft_lighthouse") and "RUST_LOG" not in os.environ and not plan.debug:
        env["RUST_LOG"] = "warn"  # torchft logs every quorum and commit at its default level (shown with --debug)
    # what Accelerate's launcher exports, for libraries that read it themselves (transformers' TrainingArguments)
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
    # lazy: torch loads after the arguments are checked (a refusal never waits for it)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException  # lazy: as above
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # lazy: as above
    from torch.distributed.elastic.rendezvous.api import RendezvousError  # lazy: as above

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
        with patched_environ(worker_environ(plan, command)), quiet_torchelastic(plan.debug), RestartReporter.attached(plan):
            if copier:
                copier.start()
            torchrun.run(args)
        return 0
    except ChildFailedError as err:
        _stop(copier)  # the workers' last stderr lines first, then the report
        _last_failure["stderr"] = failed_stderr_tail(err.failures, log_dir)
        report, code = describe_failures(err.failures, log_dir, plan.max_restarts, shown=True)
        print(report, file=sys.stderr, flush=True)
        if not command.as_accelerate and not command.no_python and failures_need_accelerate(err.failures, log_dir):
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


def _stop(copier: StderrCopier | None) -> None:
    if copier is not None:
        copier.stop()


