"""One ordered channel for a worker's two streams.

torchrun writes each worker's stderr to a file, which the launcher copies to its own stderr as it grows (the
file also feeds the failure and hang reports), while the worker's stdout went straight to the launcher's
stdout. Copying lags the straight path, so where both streams end in one pipe (``2>&1 | tee log``, CI logs) a
worker's stdout line overtook the stderr line written just before it (the demo's accuracy before its last
progress line). So the worker's Python ``sys.stdout`` writes into the same file, each write framed as
``MARK <length>:<bytes>``, and the launcher's copier splits the file back into the two streams in the order
they were written. Bytes written to file descriptor 1 directly (C code, a child process given
``stdout=sys.stdout``, ``faulthandler.enable(sys.stdout)``: ``sys.stdout.fileno()`` answers 1) still go straight
to the launcher's stdout: they arrive, but not ordered with the framed writes around them, which the launcher
copies a moment later (its copier's interval; tests/launchers/test_quiet_output.py).
"""

from __future__ import annotations

import io
import os
import sys
from typing import IO

#: set by the launcher for its workers when their stderr goes to a file it copies
FRAMED_STDOUT_VAR = "OVERDRIVE_FRAMED_STDOUT"
MARK = b"\x00overdrive-stdout "  # a NUL byte: never in text a program writes to stderr


class _FramedWriter(io.RawIOBase):
    """Writes each chunk to file descriptor ``fd`` as one framed record."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
        payload = bytes(data)
        if payload:
            record = MARK + str(len(payload)).encode() + b":" + payload
            written = 0
            while written < len(record):
                written += os.write(self._fd, record[written:])
        return len(payload)

    def fileno(self) -> int:
        return 1  # what a caller writing to the descriptor directly should use: the real stdout

    def isatty(self) -> bool:
        return os.isatty(1)


def frame_stdout() -> None:
    """In a worker: route ``sys.stdout`` into the stderr file as framed records (see the module)."""
    stream: IO[str] = io.TextIOWrapper(_FramedWriter(2), encoding=sys.stdout.encoding,  # pyright: ignore[reportArgumentType]
                                       errors=sys.stdout.errors, line_buffering=True, write_through=True)
    sys.stdout = stream


def split(buffer: bytes) -> tuple[list[tuple[bool, bytes]], bytes]:
    """``buffer`` (the file's new bytes, after what was left over last time) as ``(is_stdout, bytes)`` pieces
    in order, and the tail to keep for next time (an incomplete record, or what may be the start of a mark)."""
    pieces: list[tuple[bool, bytes]] = []
    while buffer:
        at = buffer.find(MARK)
        if at < 0:
            keep = _partial_mark(buffer)
            if len(buffer) > keep:
                pieces.append((False, buffer[:len(buffer) - keep]))
            return pieces, buffer[len(buffer) - keep:]
        if at:
            pieces.append((False, buffer[:at]))
        digits = at + len(MARK)
        colon = digits
        while colon < len(buffer) and buffer[colon:colon + 1].isdigit():
            colon += 1
        if colon == len(buffer):  # the length is still being written
            return pieces, buffer[at:]
        if colon == digits or buffer[colon:colon + 1] != b":":  # not a record: the mark's bytes are stderr text
            pieces.append((False, buffer[at:digits]))
            buffer = buffer[digits:]
            continue
        size = buffer[digits:colon]
        end = colon + 1 + int(size)
        if end > len(buffer):
            return pieces, buffer[at:]
        pieces.append((True, buffer[colon + 1:end]))
        buffer = buffer[end:]
    return pieces, b""


def _partial_mark(buffer: bytes) -> int:
    """How many bytes at the end of ``buffer`` could be the beginning of a mark."""
    for keep in range(min(len(MARK) - 1, len(buffer)), 0, -1):
        if MARK.startswith(buffer[-keep:]):
            return keep
    return 0


def stderr_text(raw: bytes) -> str:
    """The stderr part of a worker's stderr file (its stdout records left out), as text."""
    pieces, rest = split(raw)
    return (b"".join(data for is_stdout, data in pieces if not is_stdout) + rest).decode(errors="replace")
