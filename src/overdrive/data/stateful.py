"""Prepared loaders on torchdata's ``StatefulDataLoader`` (``use_stateful_dataloader=True``), as Accelerate builds
them: ``state_dict()`` is torchdata's, taken when the batch was handed out (the loader reads one batch ahead),
and ``load_state_dict()`` resumes torchdata's way.

    loader = DataLoaderShard(range(16), batch_size=4, use_stateful_dataloader=True)
    state = loader.state_dict()   # equal to a StatefulDataLoader's after as many batches
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

_STATEFUL: dict[type, type] = {}


class SelfReference:
    """``loader.base_dataloader``: Accelerate's loaders wrap a DataLoader, overdrive's are one, so it is the
    loader itself; read on the class it raises ``AttributeError``, as Accelerate's does."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            raise AttributeError("base_dataloader belongs to a loader, not to its class")
        return obj


class TorchdataState:
    """torchdata's state dict for a loader that reads ahead: the state recorded when each batch was read, handed
    back for the batch the loop holds. Mixed in before the prepared loader class by
    :func:`stateful_loader_class`."""

    use_stateful_dataloader = True
    _base: Any
    _read_per_step: Any  # batches read per step handed out: the prepared loader class says
    batches_yielded: int
    end_of_dataloader: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # as Accelerate's adapter: the state is read once at construction (torchdata makes its iterator then)
        # and is what state_dict() gives until the first batch
        self.__dict__["_initial_state"] = self._base.state_dict(self)

    def _base_iter(self) -> Iterator[Any]:
        return self._recording(self._base.__iter__(self))

    def _recording(self, raw: Iterator[Any]) -> Iterator[Any]:
        """``raw``, noting torchdata's state after each batch read (the last few suffice: the loop holds at most
        one step of batches)."""
        states: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=2 * self._read_per_step() + 2)
        self.__dict__["_read_states"], self.__dict__["_handed_from"] = states, self.batches_yielded
        for count, batch in enumerate(raw, 1):
            states.append((count, self._base.state_dict(self)))
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """torchdata's state after the batches handed out so far (the one the loop holds included)."""
        read = self.__dict__.get("_read_states")
        if read:
            wanted = (self.batches_yielded - self.__dict__["_handed_from"]) * self._read_per_step()
            for count, state in read:
                if count == wanted:
                    return {**state, "_iterator_finished": self.end_of_dataloader}
        if read is None and "_initial_state" in self.__dict__:
            return self.__dict__["_initial_state"]
        return self._base.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a torchdata state dict at the next iteration."""
        self.__dict__.pop("_read_states", None)
        self.__dict__["_initial_state"] = state_dict
        self._base.load_state_dict(self, state_dict)


def stateful_loader_class(cls: type, reads_ahead: bool = True) -> type:
    """``cls`` built on torchdata's ``StatefulDataLoader``: an instance is a ``StatefulDataLoader``, iterates
    through its iterator, and its ``state_dict`` / ``load_state_dict`` are torchdata's (as Accelerate's;
    ``reads_ahead``: a prepared loader, whose state is the one noted when the held batch was read)."""
    if getattr(cls, "use_stateful_dataloader", False):
        return cls
    if cls not in _STATEFUL:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader  # lazy: optional dependency
        except ImportError as exc:
            raise ImportError("use_stateful_dataloader=True needs torchdata's StatefulDataLoader: pip install "
                              "torchdata (or set use_stateful_dataloader=False)") from exc
        bases = (TorchdataState, cls, StatefulDataLoader) if reads_ahead else (cls, StatefulDataLoader)
        _STATEFUL[cls] = type(f"Stateful{cls.__name__}", bases, {"_base": StatefulDataLoader, "__module__": cls.__module__,
                                                                 "use_stateful_dataloader": True})
    return _STATEFUL[cls]
