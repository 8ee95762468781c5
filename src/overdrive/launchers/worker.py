"""What ``overdrive launch`` runs in each worker before the user's script: ``python -m overdrive.launchers.worker
{script|module|program} TARGET ARGS...``.

torchrun starts each worker in a session of its own, so when the launcher is killed outright (``kill -9``,
the out-of-memory killer) nothing stops the workers: they would train on as orphans. Here the worker asks
Linux to kill it when its parent dies (``PR_SET_PDEATHSIG``), checks that the parent is still the launcher
(it may have died before that call), and registers ``faulthandler`` on SIGUSR1 so that a hang report can
ask for its Python stack. Then it runs the target as ``python script.py`` / ``python -m module`` would,
or replaces itself with the program.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import runpy
import signal
import sys
from types import TracebackType

from overdrive.launchers.protocol import LAUNCHER_PID_VAR
from overdrive.launchers.relay import FRAMED_STDOUT_VAR, frame_stdout

_PR_SET_PDEATHSIG = 1


def die_with_parent(launcher_pid: int | None) -> None:
    """Be killed (SIGKILL) when the parent process dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the launcher's reaper still removes its files
            pass
    if launcher_pid is not None and os.getppid() != launcher_pid:
        print(f"overdrive: the launcher (pid {launcher_pid}) ended before this worker started; exiting",
              file=sys.stderr, flush=True)
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    """Run ``python -m overdrive.launchers.worker {script|module|program} TARGET ARGS...`` (see the module)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in ("script", "module", "program"):
        raise SystemExit("usage: python -m overdrive.launchers.worker {script|module|program} TARGET [ARGS...]")
    kind, target, args = argv[0], argv[1], argv[2:]
    pid = os.environ.get(LAUNCHER_PID_VAR, "")
    die_with_parent(int(pid) if pid.isdigit() else None)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    if os.environ.get(FRAMED_STDOUT_VAR) == "1" and kind != "program":
        frame_stdout()  # stdout joins the stderr file the launcher copies, in the order written
    if kind == "program":
        os.execvp(target, [target, *args])  # the parent-death signal survives exec
    sys.argv = [target, *args]
    if kind == "script":
        # as ``python script.py``: the script's folder first on sys.path (in place of this module's)
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank through the launcher, which says so in one line: no traceback per rank
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as exc:
        # the traceback as ``python script.py`` shows it: from the user's code, without this module and runpy
        trimmed = user_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)  # torch's hook reads __traceback__
        raise SystemExit(1) from None


def user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames of this module and of runpy (the launcher's plumbing)."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.endswith("runpy>")):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    main()
