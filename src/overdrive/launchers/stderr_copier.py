"""The workers' stderr files, copied to the launcher's stderr as they are written (their stdout records to its
stdout, in the order written: ``relay.py``), so a failed rank's traceback shows next to the launcher's report."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TextIO

from overdrive.launchers import relay


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

