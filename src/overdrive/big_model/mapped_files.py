"""Weights left in a file's memory mapping, and a guard that turns a vanished page into an error.

A tensor viewed through a private (copy-on-write) map of a checkpoint file costs no copy: its pages come
from the page cache when first read, are reclaimable, and are shared by every process that maps the same
file; a write copies only the page written and never reaches the file. The one danger is the file
shrinking under the mapping (truncated, or rewritten in place): the next read of a page past the new end
makes the kernel send SIGBUS, which kills the process without a Python traceback.

:func:`guard` records a mapping. The first call installs a SIGBUS handler (Linux, main thread) that, for an
address inside a recorded mapping, maps zero pages over the lost part, so the read that faulted completes,
and raises :class:`MappedFileError` in the Python thread that was reading (the main thread when the read
came from one of torch's worker threads) as soon as it runs Python code again; the handler is process-wide
(``sigaction``), so it is installed from any thread. Faults anywhere else go to
the handler that was there before (the default crash, or ``faulthandler``'s). A file replaced by a new one
(``os.replace``, a fresh download) is harmless: the mapping keeps the old file's data.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import mmap
import os
import signal
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["MappedFileError", "guard", "guarded_regions", "shrank_message"]


@dataclass
class _Region:
    end: int
    path: str
    mapped: weakref.ref[mmap.mmap]
    size: int


_regions: dict[int, _Region] = {}
_faults: list[str] = []
_installed: list[Any] = []  # [handler callback, previous sigaction] once installed


class MappedFileError(RuntimeError):
    """A file that weights are mapped from shrank while mapped: the weights read from the lost part are
    gone (read as zeros). Reload the model from an intact checkpoint."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (_faults[-1] if _faults else "a mapped weights file was truncated",)))


def shrank_message(path: str, was: int, now: int, when: str) -> str:
    """The error for a weights file that shrank from ``was`` to ``now`` bytes ``when``."""
    return (f"{path} shrank from {was} to {now} bytes {when}. Do not truncate or rewrite a checkpoint in place "
            "while a model loaded from it is alive (write a new file and os.replace it instead); reload the model.")


def guarded_regions() -> dict[int, tuple[int, str]]:
    """The recorded mappings: ``{start address: (end address, file path)}``."""
    return {start: (region.end, region.path) for start, region in _regions.items()}


def guard(mapped: mmap.mmap, start: int, path: str) -> None:
    """Record ``mapped`` (a map of all of ``path`` from offset 0, whose first byte is at address ``start``)
    so that a truncation of the file raises :class:`MappedFileError` instead of killing the process. The
    record goes when the map is freed."""
    _regions[start] = _Region(start + len(mapped), os.path.abspath(path), weakref.ref(mapped), mapped.size())
    weakref.finalize(mapped, _regions.pop, start, None)
    if not _installed:
        _install()


class _Sigaction(ctypes.Structure):
    # glibc's struct sigaction on 64-bit Linux (x86_64 and aarch64): handler, 1024-bit mask, flags, restorer
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


_SA_SIGINFO = 4
_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def _install() -> None:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        _installed.append(None)  # no guard: a truncated file crashes the process, as with safetensors
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    previous = _Sigaction()
    callback = _HANDLER(_on_sigbus)  # no wrapper frame: see the end of _on_sigbus
    action = _Sigaction()
    action.handler = ctypes.cast(callback, ctypes.c_void_p).value
    action.flags = _SA_SIGINFO

    if libc.sigaction(signal.SIGBUS, ctypes.byref(action), ctypes.byref(previous)) != 0:
        raise OSError(ctypes.get_errno(), "could not install the SIGBUS guard for mapped weights")
    _installed.extend([callback, previous, libc])
    # the previous handler back before the interpreter frees the callback
    atexit.register(libc.sigaction, signal.SIGBUS, ctypes.byref(previous), None)


def _on_sigbus(signum: int, info: int, context: int) -> None:
    """Runs in the thread whose read faulted, with the GIL (ctypes takes it).

    The error must be raised after this handler returns, not inside it: the interpreter delivers an
    asynchronous exception at its next check, and there is one after every call, so an exception set by
    a call here (or set for this thread by another faulting thread) would be raised in this frame, where
    ctypes prints and drops it. So: an exception that fires here is caught and set again on the way out,
    by deleting objects whose weakref callbacks set it; nothing checks after a ``del``.
    """
    address = ctypes.c_void_p.from_address(info + 16).value or 0  # siginfo_t.si_addr on 64-bit Linux
    notify: set[int] = set()
    while True:
        try:
            notify |= _patch(address)
            triggers = [_Trigger() for _ in notify]
            watchers = [weakref.ref(trigger, functools.partial(_set_async_exc, thread, MappedFileError))
                        for trigger, thread in zip(triggers, notify)]
            break
        except MappedFileError:
            notify.add(threading.get_ident())  # pending for this thread: fired here, to be set again
    del triggers  # each trigger's weakref callback sets the error for its thread
    del watchers


def _patch(address: int) -> set[int]:
    """Zero pages over the lost part of the mapping holding ``address``; the threads to tell."""
    _, previous, libc = _installed
    # (list(): one C call, a snapshot that another thread freeing a map cannot change under the loop)
    found = [(start, region) for start, region in list(_regions.items()) if start <= address < region.end]
    if not found:
        # not ours: put the previous handler back; the faulting read runs again and gets it
        libc.sigaction(signal.SIGBUS, ctypes.byref(previous), None)
        return set()
    start, region = found[0]
    page = mmap.PAGESIZE
    mapped = region.mapped()
    size = mapped.size() if mapped is not None else 0  # the mapped file's size now (fstat of its own handle)
    lost = min(start + -(-size // page) * page, address - address % page)
    # anonymous zero pages over the part past the file's new end: the faulting read completes
    done = libc.mmap(lost, region.end - lost, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)  # 0x10: MAP_FIXED
    if done != lost:
        libc.sigaction(signal.SIGBUS, ctypes.byref(previous), None)  # could not patch: crash as before
        return set()
    _faults.append(shrank_message(region.path, region.size, size, f"while weights were mapped from it (a read at "
                                  f"byte {address - start} faulted); the weights stored past byte {size} are lost "
                                  "(now zeros)"))
    thread = threading.get_ident()
    if thread not in {known.ident for known in threading.enumerate()}:
        thread = threading.main_thread().ident or thread  # a native worker thread: tell the main thread
    return {thread}


class _Trigger:
    """An object to delete (anything weakly referable)."""


# PyThreadState_SetAsyncExc(thread id, exception class); the weakref callback passes the weakref as a third
# argument, which the C function ignores (64-bit Linux calling conventions pass it in a spare register)
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object, ctypes.py_object]
_set_async_exc.restype = ctypes.c_int
