"""runtime.process_group's exit hook: a process that joined a group waits, at exit, for its other threads
(gloo's workers) to stop running, so none of them is cut off by the interpreter's shutdown."""

from __future__ import annotations

import threading
import time

import torch

from overdrive.runtime.process_group import let_threads_settle


def test_exit_hook_waits_while_another_thread_runs_and_no_longer() -> None:
    # a thread busy in C code without the GIL, as gloo's worker is between a collective and freeing it
    matrix = torch.randn(600, 600)
    finished = threading.Event()

    def work() -> None:
        for _ in range(20):
            matrix @ matrix
        finished.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    let_threads_settle(limit=30.0)
    assert finished.is_set(), "the hook returned while another thread was still running"
    thread.join()
    start = time.monotonic()
    let_threads_settle(limit=30.0)  # nothing runs now: returns at once, not at the limit
    assert time.monotonic() - start < 5.0


def test_exit_hook_gives_up_at_its_limit() -> None:
    stop = threading.Event()
    matrix = torch.randn(300, 300)

    def spin() -> None:
        while not stop.is_set():
            matrix @ matrix

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        let_threads_settle(limit=0.3)
        assert time.monotonic() - start < 5.0
    finally:
        stop.set()
        thread.join()


def _watchdog_threads_after_exit_hook() -> list[int]:
    from overdrive import Accelerator
    from overdrive.runtime import watchdog

    Accelerator()
    before = sum(t.name == "overdrive-watchdog" and t.is_alive() for t in threading.enumerate())
    watchdog._mark_exit()  # what atexit runs
    after = sum(t.name == "overdrive-watchdog" and t.is_alive() for t in threading.enumerate())
    return [before, after]


def test_the_watchdog_thread_has_ended_when_the_exit_hook_returns() -> None:
    # a daemon thread inside a store call when the interpreter shuts down aborts the process
    from tests.support.distributed import run_distributed

    assert run_distributed(_watchdog_threads_after_exit_hook, 2, timeout=120) == [[1, 0], [1, 0]]
