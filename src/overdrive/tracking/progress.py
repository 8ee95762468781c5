"""A progress bar for the main process that behaves in log files.

    for batch in progress_bar(loader, desc="train", process_index=accelerator.process_index):
        ...

On a terminal it is a ``tqdm`` bar. When the output is not a terminal (a log file, a cluster job's
stdout) it prints plain lines, no carriage returns, only when progress crosses another ``percent_step``
percent or ``min_interval`` seconds have passed, plus one line when it closes. Other processes print nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TextIO

from overdrive.runtime import group  # imported when a bar starts: importing this module stays light


def _process_index() -> int:
    return group.rank()


def _format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class ProgressBar:
    """Progress over ``iterable`` (or ``total`` steps advanced with ``update``), shown by one process.

    ``main_process_only`` (default): only process 0 shows it (``process_index`` defaults to the rank in
    the default process group). ``file`` defaults to stderr. ``force_plain`` picks the plain-line mode even
    on a terminal. ``clock`` returns seconds (for tests).
    """

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "", *,
                 main_process_only: bool = True, process_index: int | None = None,
                 file: TextIO | None = None, min_interval: float = 30.0, percent_step: float = 10.0,
                 unit: str = "it", force_plain: bool = False, clock: Callable[[], float] = time.monotonic,
                 **tqdm_kwargs: Any) -> None:
        self.iterable = iterable
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.total = total
        self.desc = desc
        self.unit = unit
        self.file = file if file is not None else sys.stderr
        self.min_interval = min_interval
        self.percent_step = percent_step
        self.clock = clock
        self.n = 0
        self.postfix: dict[str, Any] = {}
        index = _process_index() if process_index is None else process_index
        self.enabled = not main_process_only or index == 0
        self.plain = force_plain or not _is_terminal(self.file)
        self._tqdm: Any = None
        self._start = self._last_line_time = clock()
        self._last_line_n = 0
        self._closed = False
        if self.enabled and not self.plain:
            from tqdm.auto import tqdm  # lazy: tqdm.auto is loaded only when a bar is shown

            self._tqdm = tqdm(total=total, desc=desc, unit=unit, file=self.file, **tqdm_kwargs)

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("ProgressBar has no iterable: pass one, or call update() yourself")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("ProgressBar has no total")
        return self.total

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` steps."""
        self.n += n
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self._line_due():
            self._print_line()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True,
                    **values: Any) -> None:
        """Show ``values`` (e.g. ``loss=0.31``) after the counts (tqdm's signature)."""
        self.postfix = {**(ordered_dict or {}), **values}
        if self._tqdm is not None:
            self._tqdm.set_postfix(self.postfix, refresh=refresh)

    def set_description(self, desc: str) -> None:
        """Change the text before the bar."""
        self.desc = desc
        if self._tqdm is not None:
            self._tqdm.set_description(desc)

    def write(self, message: str) -> None:
        """Print ``message`` on its own line (from the showing process only) without breaking the bar."""
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.write(message, file=self.file)
        else:
            print(message, file=self.file, flush=True)

    def close(self) -> None:
        """Close the bar (showing the final count); later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.n != self._last_line_n or self.n == 0:
            self._print_line()

    def _line_due(self) -> bool:
        now = self.clock()
        if now - self._last_line_time >= self.min_interval:
            return True
        if self.total and self.percent_step > 0:
            step = self.percent_step / 100 * self.total
            return int(self.n / step) > int(self._last_line_n / step)
        return False

    def _print_line(self) -> None:
        now = self.clock()
        elapsed = now - self._start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}: " if self.desc else ""]
        if self.total:
            parts.append(f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)")
        else:
            parts.append(f"{self.n} {self.unit}")
        parts.append(f" {rate:.2f} {self.unit}/s, elapsed {_format_seconds(elapsed)}")
        if self.total and rate > 0 and self.n < self.total:
            parts.append(f", eta {_format_seconds((self.total - self.n) / rate)}")
        if self.postfix:
            parts.append(", " + ", ".join(f"{k}={_format_value(v)}" for k, v in self.postfix.items()))
        print("".join(parts), file=self.file, flush=True)
        self._last_line_time = now
        self._last_line_n = self.n


def _format_value(value: Any) -> str:
    if hasattr(value, "item"):
        value = value.item()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _is_terminal(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def progress_bar(iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 **kwargs: Any) -> ProgressBar:
    """A ``ProgressBar``; see there for the options."""
    return ProgressBar(iterable, total=total, desc=desc, **kwargs)
