"""The gradient-accumulation window: the one owner of its size, position, loss divisor and sync flag.

A window is ``num_steps`` micro-batches, or fewer at the end of the data: the loss of each micro-batch
is divided by the true window length, so one optimizer step equals one step on the concatenated batch.
The Accelerator calls :meth:`AccumulationWindow.begin` once per micro-batch (a few attribute operations:
it is on the hot path); ``GradientState``, the prepared optimizers and schedulers, the pipeline schedule
and the checkpoints all read this one object.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overdrive.config import GradientAccumulationPlugin

#: the context of a micro-batch with nothing to enter (gradients synchronise, or one process): shared, since
#: a ``nullcontext`` holds no state and may be entered by any number of blocks at once
NO_CONTEXT = contextlib.nullcontext()

#: the keys of :meth:`AccumulationWindow.state_dict` (the checkpoint's ``counters``)
STATE_KEYS = ("step", "window_pos", "window_size", "loss_divisor", "num_steps")


class AccumulationWindow:
    """Where training stands in the current accumulation window::

        window = AccumulationWindow(num_steps=4)
        for batch in batches:
            window.begin()           # -> True on the micro-batch whose gradients synchronise
            (loss / window.divisor).backward()

    ``sync`` is what ``accelerator.sync_gradients`` reports; ``step`` counts micro-batches as Accelerate's
    ``Accelerator.step`` does: it goes back to 0 on the last batch of a loader (with ``sync_with_dataloader``).
    """

    __slots__ = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch", "exact_last_window",
                 "position", "size", "divisor", "sync", "step", "_length")

    def __init__(self, num_steps: int = 1, adjust_scheduler: bool = True, sync_with_dataloader: bool = True,
                 sync_each_batch: bool = False, exact_last_window: bool = False) -> None:
        _check_steps(num_steps)
        self.num_steps = num_steps
        self.adjust_scheduler = adjust_scheduler
        self.sync_with_dataloader = sync_with_dataloader
        self.sync_each_batch = sync_each_batch
        #: overdrive's switch: a window cut short by the end of the data divides by its real length (the mean
        #: over its micro-batches); off, as in Accelerate, every loss is divided by ``num_steps``
        self.exact_last_window = exact_last_window
        #: micro-batches of the current window already begun (0: the next one opens a window)
        self.position = 0
        #: the length of the current window (``num_steps``, or fewer at the end of the data)
        self.size = num_steps
        #: what each micro-batch's loss is divided by (``num_steps``; the window's size with ``exact_last_window``)
        self.divisor = num_steps
        #: whether gradients synchronise (and the optimizer steps) on this micro-batch
        self.sync = True
        #: micro-batches begun since the start or the last end of a loader (``accelerator.step``)
        self.step = 0
        # (loader, its position when its length was read, the length): len() of a prepared loader is a
        # chain of Python calls; it does not change within an epoch, so it is read once per epoch
        self._length: tuple[weakref.ref[Any], int, int] | None = None

    @classmethod
    def from_plugin(cls, plugin: GradientAccumulationPlugin) -> AccumulationWindow:
        """A window with a ``GradientAccumulationPlugin``'s settings (``num_steps=None`` means 1)."""
        window = cls()
        window.configure(plugin)
        return window

    def configure(self, plugin: GradientAccumulationPlugin) -> None:
        """Take a ``GradientAccumulationPlugin``'s settings (``num_steps=None`` means 1)."""
        self.set_num_steps(plugin.num_steps or 1)
        self.adjust_scheduler = plugin.adjust_scheduler
        self.sync_with_dataloader = plugin.sync_with_dataloader
        self.sync_each_batch = plugin.sync_each_batch
        self.exact_last_window = plugin.exact_last_window

    def begin(self, loader: Any = None, end_of_data: bool = False) -> bool:
        """Start one micro-batch; return whether it ends the window (its gradients then synchronise).

        ``loader`` is the active prepared data loader (its ``batches_yielded`` shortens the last window
        of the data) and ``end_of_data`` whether its current batch is its last."""
        if self.position == 0 and self.num_steps > 1:  # (a window of 1 is always 1: nothing to open)
            self._open(loader)
        self.position += 1
        ends_data = end_of_data and self.sync_with_dataloader
        # Accelerate's count: +1 per micro-batch, back to 0 on the last batch of a loader
        self.step = 0 if ends_data else self.step + 1
        sync = ends_data or self.position >= self.size
        if sync:
            self.position = 0
        self.sync = sync
        return sync

    def _open(self, loader: Any) -> None:
        size = self.num_steps
        yielded = getattr(loader, "batches_yielded", None)
        if size > 1 and self.sync_with_dataloader and yielded is not None:
            known = self._length
            if known is not None and known[0]() is loader and known[1] < yielded:
                # the same loader, further on in the same epoch: the length read at the epoch's start (inline:
                # this runs at every window)
                self._length = (known[0], yielded, known[2])
                length = known[2]
            else:
                length = self._loader_length(loader, yielded)
            if length is not None:
                size = max(1, min(size, length - yielded + 1))
        self.size = size
        self.divisor = size if self.exact_last_window else self.num_steps

    def _loader_length(self, loader: Any, yielded: int) -> int | None:
        """``len(loader)`` (None without one: an iterable dataset), read when the loader changed or its
        position went back (a new epoch); ``_open`` reuses it otherwise."""
        self._length = None
        try:
            length = len(loader)
        except TypeError:
            return None
        with contextlib.suppress(TypeError):  # (a loader that takes no weak reference is not cached)
            self._length = (weakref.ref(loader), yielded, length)  # weak: the window must not keep a loader alive
        return length

    def set_num_steps(self, num_steps: int) -> None:
        """Change the window length; the next window and the current loss divisor use it."""
        _check_steps(num_steps)
        self.num_steps = self.divisor = num_steps
        if self.position == 0 or num_steps == 1:
            self.size = num_steps

    def reset(self) -> None:
        """Back to the start: no micro-batch begun, gradients synchronise."""
        self.position = self.step = 0
        self.size = self.divisor = self.num_steps
        self.sync = True
        self._length = None

    def state_dict(self) -> dict[str, int]:
        """The counters a checkpoint keeps (``Stateful``)."""
        return {"step": self.step, "window_pos": self.position, "window_size": self.size,
                "loss_divisor": self.divisor, "num_steps": self.num_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counters (the window length setting stays this run's)."""
        missing = [key for key in STATE_KEYS if key != "num_steps" and key not in state_dict]
        if missing:
            raise KeyError(f"accumulation window state lacks {missing}; it has {sorted(state_dict)}")
        self.step = int(state_dict["step"])
        self.position = int(state_dict["window_pos"])
        self.size = int(state_dict["window_size"])
        self.divisor = int(state_dict["loss_divisor"])
        self.sync = self.position == 0

    def __repr__(self) -> str:
        return (f"AccumulationWindow(num_steps={self.num_steps}, position={self.position}, size={self.size}, "
                f"divisor={self.divisor}, sync={self.sync}, step={self.step})")


def _check_steps(num_steps: Any) -> None:
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"gradient_accumulation_steps={num_steps!r} is not valid; it must be an integer >= 1")
