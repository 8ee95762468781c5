"""The prepared data loader: epoch and position bookkeeping, end-of-data look-ahead, device placement.

A prepared loader knows where it stands in the data (epoch, batches handed out), so it can tell
``GradientState`` that the batch it hands out is the last one before the user's loop body runs, and can
save and restore its position for an exact mid-epoch resume.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader

import overdrive.helpers.ops as ops
from overdrive.data.sampler import BatchSamplerShard, IterableDatasetShard
from overdrive.data.shuffling import _find_seedable
from overdrive.data.stateful import SelfReference, stateful_loader_class
from overdrive.helpers.ops import recursively_apply, send_to_device
from overdrive.helpers.random import synchronize_rng_states
from overdrive.runtime import group
from overdrive.training.state import GradientState

_END = object()  # no more batches
#: keywords of Accelerate's loader constructors, taken off before the DataLoader sees them
_ACCELERATE_KEYWORDS = ("use_stateful_dataloader", "skip_batches", "iteration", "_drop_last", "_non_blocking",
                        "torch_device_mesh")

# DataLoader settings carried over when a loader is rebuilt (those this torch version has).
_KEPT_SETTINGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                  "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                  "pin_memory_device", "in_order")


def loader_settings(dataloader: DataLoader) -> dict[str, Any]:
    """The keyword arguments that rebuild ``dataloader``'s behaviour around a new sampler or dataset."""
    return {name: getattr(dataloader, name) for name in _KEPT_SETTINGS if hasattr(dataloader, name)}


def _distributed() -> bool:
    return group.is_distributed()


def with_last_flag(iterator: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs: fetching one item ahead tells which one is the last."""
    try:
        current = next(iterator)
    except StopIteration:
        return
    for upcoming in iterator:
        yield current, False
        current = upcoming
    yield current, True


class DataLoaderStateMixin:
    """Accelerate's name for a loader that reports to ``GradientState`` (``end_of_dataloader``, ``remainder``):
    every prepared loader is one. ``begin()`` / ``end()`` register and unregister it by hand."""

    gradient_state: GradientState
    end_of_dataloader: bool

    def reset(self) -> None:
        """Not at the end of the data."""
        self.end_of_dataloader = False

    def begin(self) -> None:
        """Make this the active loader of ``GradientState`` (what iterating does)."""
        self.reset()
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Stop being the active loader of ``GradientState`` (a loop that breaks out early may call it)."""
        self.gradient_state._remove_dataloader(self)


class PreparedLoaderMixin(DataLoaderStateMixin):
    """What both prepared loaders share: epoch, position, end of data, device placement, state dict.

    Subclasses (which also derive from ``DataLoader``) call ``_init_prepared`` after building the loader
    and implement ``_batches(skip)``, yielding ``(batch, is_last)`` from position ``skip`` of the epoch.
    ``use_stateful_dataloader=True`` (Accelerate's keyword) makes an instance of the class built on torchdata's
    ``StatefulDataLoader``.
    """

    use_stateful_dataloader = False
    base_dataloader = SelfReference()

    #: called with the loader as each iteration begins, before its position is read (a strategy that takes
    #: part in a quorum there: fault-tolerant training); None: nothing
    before_epoch: Callable[[Any], None] | None = None

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        del args, kwargs  # for __init__
        return object.__new__(stateful_loader_class(cls) if use_stateful_dataloader else cls)

    #: the DataLoader class whose constructor and iterator the prepared loader uses (torchdata's
    #: StatefulDataLoader in the classes :func:`stateful_loader_class` makes)
    _base: type[DataLoader] = DataLoader
    # set by _init_prepared; declared for type checkers
    gradient_state: GradientState
    batch_sampler: Any
    dataset: Any
    generator: Any
    batch_size: int | None

    def _init_prepared(self, shard: Any, device: torch.device | str | None, non_blocking: bool,
                       rng_types: list[Any] | None, gradient_state: GradientState | None,
                       synchronized_generator: torch.Generator | None = None, exact_resume: bool = False) -> None:
        self._shard = shard  # holds even_batches and drop_last (a BatchSamplerShard or IterableDatasetShard)
        self._even_batches = True if shard is None else shard.even_batches
        self.device = device
        # A DataLoader collates on the CPU: moving to the CPU would only walk each batch for nothing.
        self._moves_batches = device is not None and torch.device(device).type != "cpu"
        self.non_blocking = non_blocking
        self.rng_types = list(rng_types or [])
        #: the generator kept equal on every rank at each epoch start ("generator" in ``rng_types``)
        self.synchronized_generator = synchronized_generator
        #: ``load_state`` puts this loader back at its saved position (``DataLoaderConfiguration(exact_resume=True)``;
        #: a stateful loader restores torchdata's state instead); otherwise the script skips batches itself
        self.exact_resume = bool(exact_resume)
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self._seedable = _find_seedable(self.batch_sampler)
        self._epoch = 0
        self._epoch_set = False  # the next iteration uses _epoch as it is (set_epoch or a restored state)
        self._iterated = False
        self._skip_next = 0  # batches of the next iteration to skip (resume / skip_first_batches)
        # skip_first_batches shortens len() as Accelerate's skipping loader does; a position restored by
        # load_state does not, so Accelerate's resume recipe (starting epoch = step // len) still holds
        self._skip_in_len = True
        self.batches_yielded = 0  # the position in the epoch (skipped batches count)
        self.end_of_dataloader = False

    def _accelerate_keywords(self, kwargs: dict[str, Any]) -> None:
        """Accelerate's constructor keywords: ``skip_batches`` and ``iteration`` (the epoch) apply; the others
        (``use_stateful_dataloader`` chose the class, ``_drop_last``, ``torch_device_mesh``) are implied."""
        self.skip_first(int(kwargs.pop("skip_batches", 0) or 0))
        iteration = kwargs.pop("iteration", 0)
        if iteration:
            self.set_epoch(iteration)
        # Accelerate's loaders carry the wrapped loader's drop_last as given; it outlives skip_first_batches
        self._given_drop_last: bool | None = kwargs.pop("_drop_last", None)
        for name in ("use_stateful_dataloader", "torch_device_mesh", "_non_blocking"):
            kwargs.pop(name, None)

    def _base_iter(self) -> Iterator[Any]:
        """The DataLoader iterator the prepared loader reads from."""
        return self._base.__iter__(self)  # pyright: ignore[reportArgumentType]

    def _read_per_step(self) -> int:
        """Batches read from the DataLoader iterator per step handed out (the dispatcher reads every process's)."""
        return 1

    @property
    def iteration(self) -> int:
        """The epoch (Accelerate's name: iterations started, or the one ``set_epoch`` chose)."""
        return self._epoch

    # -- the contract the rest of the library reads ----------------------------------------------
    @property
    def even_batches(self) -> bool:
        """Whether every process gets the same number of full batches; a change applies at the next
        iteration."""
        return self._shard.even_batches if self._shard is not None else self._even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if self._shard is not None:
            self._shard.even_batches = bool(value)
        self._even_batches = bool(value)

    def steps_after_own_end(self) -> int:
        """How many steps the longest process still runs after this process's last batch: 0 unless
        ``even_batches=False`` left the processes with different numbers of batches."""
        shard = self._shard
        if shard is None or shard.even_batches or not hasattr(shard, "num_steps"):
            return 0
        try:
            counts = [shard.num_steps(i) for i in range(shard.num_processes)]
        except TypeError:  # no length
            return 0
        return max(counts) - counts[shard.process_index]

    def note_final_gather(self, local: Any, tensors: bool) -> None:
        """``gather_for_metrics`` at this process's last batch, when longer processes run more steps: remember
        the call, so that the end of the loop can join their gathers with an empty contribution."""
        if self.end_of_dataloader and self.steps_after_own_end() > 0:
            empty = recursively_apply(lambda t: t[:0] if t.ndim else t.reshape(1)[:0], local) if tensors else None
            self.__dict__.setdefault("_final_gathers", []).append((tensors, empty))

    def _join_remaining_gathers(self) -> None:
        """The other processes' last steps, each with the gathers this process made at its own last step."""
        calls = self.__dict__.pop("_final_gathers", [])
        if not calls:
            return

        steps = self.steps_after_own_end()
        _warn_short_process(steps)
        for _ in range(steps):
            for tensors, empty in calls:
                ops.gather(empty) if tensors else ops.gather_object([])

    @property
    def total_batch_size(self) -> int | None:
        """The global batch of one step: ``batch_size * num_processes``, or ``batch_size`` when split."""
        if self._shard is not None and self._shard.total_batch_size is not None:
            return self._shard.total_batch_size
        return self.batch_size

    @property
    def total_dataset_length(self) -> int | None:
        """Samples in one epoch over all processes (``None`` if the data has no length)."""
        sampler = getattr(getattr(self._shard, "batch_sampler", None), "sampler", None)
        dataset = self._shard.dataset if isinstance(self._shard, IterableDatasetShard) else self.dataset
        for source in (sampler, dataset):
            if isinstance(source, Sized):
                try:
                    return len(source)
                except TypeError:  # a __len__ that refuses (e.g. a stream of unknown length)
                    continue
        return None

    @property
    def _drop_last(self) -> bool:
        given = getattr(self, "_given_drop_last", None)
        if given is not None:
            return bool(given)
        return bool(getattr(self._shard, "drop_last", getattr(self, "drop_last", False)))

    @_drop_last.setter
    def _drop_last(self, value: bool) -> None:
        self._given_drop_last = bool(value)

    @property
    def _non_blocking(self) -> bool:
        """Accelerate's name for ``non_blocking``."""
        return self.non_blocking

    @_non_blocking.setter
    def _non_blocking(self, value: bool) -> None:
        self.non_blocking = bool(value)

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch (``total_dataset_length % total_batch_size``), or -1
        when the last batch is dropped or the length is unknown."""
        length, total = self.total_dataset_length, self.total_batch_size
        if self._drop_last or length is None or not total:
            return -1
        return length % total

    @property
    def epoch(self) -> int:
        """The epoch of the current iteration (or of the next one, once set)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order at the next iteration (otherwise each iteration advances the epoch)."""
        self._epoch = int(epoch)
        self._epoch_set = True
        self._apply_epoch(self._epoch)

    def _apply_epoch(self, epoch: int) -> None:
        # as Accelerate: the batch sampler, its sampler, a wrapped batch sampler's sampler, else the dataset
        batch_sampler = self.batch_sampler
        targets = [batch_sampler, getattr(batch_sampler, "sampler", None)]
        inner = getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None)
        targets.append(inner if inner is not None and hasattr(inner, "set_epoch") else self.dataset)
        for target in targets:
            if target is not None and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: enough to resume mid-epoch exactly (see ``load_state_dict``)."""
        return {"seed": self._seedable.seed if self._seedable is not None else None, "epoch": self._epoch,
                "batches_yielded": self.batches_yielded, "epoch_set": self._epoch_set,
                "iterated": self._iterated, "end_of_dataloader": self.end_of_dataloader,
                "skip": self._skip_next, "skip_in_len": self._skip_in_len}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict``: the next iteration continues the saved epoch after its last handed-out
        batch, or starts the following epoch if the saved one had reached its end."""
        if state_dict.get("seed") is not None and self._seedable is not None:
            self._seedable.seed = int(state_dict["seed"])
        self._epoch = int(state_dict["epoch"])
        self._iterated = bool(state_dict.get("iterated", True))
        self.batches_yielded = int(state_dict["batches_yielded"])
        self.end_of_dataloader = bool(state_dict.get("end_of_dataloader", False))
        self._skip_in_len = True
        if state_dict.get("epoch_set", False) or not self._iterated:
            self._epoch_set = bool(state_dict.get("epoch_set", False))
            self._skip_next = int(state_dict.get("skip", 0))
            self._skip_in_len = bool(state_dict.get("skip_in_len", True))
        elif not self.end_of_dataloader:  # saved mid-epoch: continue that epoch where it stopped
            self._epoch_set, self._skip_next, self._skip_in_len = True, self.batches_yielded, False
        else:  # the saved epoch was finished: the next iteration starts the next one
            self._epoch_set, self._skip_next = False, 0

    def _remaining(self, full: int) -> int:
        """``len()``: the batches the next iteration yields after ``skip_first_batches`` (as in Accelerate,
        whose skipping loader's length is what remains); the epoch's length after ``load_state``."""
        return max(full - self._skip_next, 0) if self._skip_in_len else full

    def skip_first(self, num_batches: int) -> None:
        """Skip the first ``num_batches`` batches of the next iteration's epoch (once)."""
        if num_batches < 0:
            raise ValueError(f"num_batches={num_batches} must be >= 0")
        self._skip_next = int(num_batches)
        self._skip_in_len = True

    # -- iteration -----------------------------------------------------------------------------
    def _get_iterator(self) -> Any:
        """DataLoader draws its workers' base seed from torch's global generator each time an iterator is
        made. A run resumed mid-epoch makes one where the uninterrupted run did not, which would shift
        every later random number (dropout masks). Without a user generator, draw that seed from a
        generator of (seed, epoch) instead: the global RNG stays untouched and worker seeds resume too. Only
        with ``exact_resume``: by default the global generator is drawn from, as in Accelerate."""
        # a mixin: super() is the DataLoader it is combined with, which pyright cannot know
        if self.generator is not None or not self.exact_resume:
            return super()._get_iterator()  # pyright: ignore[reportAttributeAccessIssue]
        seed = self._seedable.seed if self._seedable is not None else 0
        self.generator = torch.Generator().manual_seed((seed * 1_000_003 + self._epoch) % 2**63)
        try:
            return super()._get_iterator()  # pyright: ignore[reportAttributeAccessIssue]
        finally:
            self.generator = None

    # -- iteration -----------------------------------------------------------------------------
    def _batches(self, skip: int) -> Iterator[tuple[Any, bool]]:
        raise NotImplementedError

    def _place(self, batch: Any) -> Any:
        device = self.device
        if device is None or not self._moves_batches:
            return batch
        return send_to_device(batch, device, non_blocking=self.non_blocking)

    def _begin(self) -> int:
        if self.before_epoch is not None:  # (it may load a state: read nothing before it ran)
            self.before_epoch(self)
        if self._iterated and not self._epoch_set:
            self._epoch += 1
        self._epoch_set, self._iterated = False, True
        skip, self._skip_next = self._skip_next, 0
        self._apply_epoch(self._epoch)
        self._synchronize_rngs()
        self.batches_yielded = skip  # a position in the epoch, so skipped batches count
        self.end_of_dataloader = False
        self.__dict__.pop("_final_gathers", None)
        self.gradient_state._add_dataloader(self)
        return skip

    def _synchronize_rngs(self) -> None:
        if not self.rng_types or not _distributed():
            return

        # "generator" means the shuffling sampler's generator; without one there is nothing to sync.
        generator = self.synchronized_generator
        types = [t for t in self.rng_types if str(getattr(t, "value", t)) != "generator" or generator is not None]
        synchronize_rng_states(types, generator)

    def _reached_end(self) -> None:
        # Called before the last batch is handed out, so the loop body already sees it.
        self.end_of_dataloader = True
        self.gradient_state.end_of_dataloader = True
        self.gradient_state.remainder = self.remainder

    def __iter__(self) -> Iterator[Any]:
        skip = self._begin()
        attributes = self.__dict__  # counting in it skips DataLoader's __setattr__, a Python call per batch
        try:
            for batch, is_last in self._batches(skip):
                attributes["batches_yielded"] += 1
                if is_last:
                    self._reached_end()
                yield batch
            self._join_remaining_gathers()
        finally:
            self.gradient_state._remove_dataloader(self)


_warned_short: list[bool] = []


def _warn_short_process(steps: int) -> None:
    """Once per process: its gathers of the other processes' last steps ran after its own loop had ended."""
    if _warned_short or steps <= 0:
        return
    _warned_short.append(True)

    warnings.warn(f"even_batches=False: this process had {steps} batch(es) fewer than the longest one, so its "
                  "loop ended first and the gather_for_metrics results of the other processes' last steps "
                  "reached only them (on Accelerate such a loop fails: its collectives do not match); compute "
                  "metrics on the main process, or keep even_batches=True", stacklevel=3)


class DataLoaderShard(PreparedLoaderMixin, DataLoader):
    """A ``DataLoader`` that yields this process's share of the data, optionally on ``device``.

    Built by :func:`prepare_data_loader` around a :class:`BatchSamplerShard` (map-style datasets) or an
    :class:`IterableDatasetShard`. ``len()`` is the number of batches this process yields per epoch.

        loader = prepare_data_loader(DataLoader(dataset, batch_size=8, shuffle=True))
        for batch in loader:
            ...
    """

    def __init__(self, dataset: Any, device: torch.device | str | None = None, rng_types: list[Any] | None = None,
                 non_blocking: bool = False, gradient_state: GradientState | None = None,
                 synchronized_generator: torch.Generator | None = None, exact_resume: bool = False,
                 **dataloader_kwargs: Any) -> None:
        accelerate_keywords = {k: dataloader_kwargs.pop(k) for k in _ACCELERATE_KEYWORDS if k in dataloader_kwargs}
        non_blocking = bool(accelerate_keywords.get("_non_blocking", non_blocking))
        self._base.__init__(self, dataset, **dataloader_kwargs)
        shard: Any = None
        if isinstance(self.batch_sampler, BatchSamplerShard):
            shard = self.batch_sampler
            # DataLoader leaves batch_size None when given a batch sampler and forbids setting it later.
            object.__setattr__(self, "batch_size", shard.per_process_batch_size)
        elif isinstance(self.dataset, IterableDatasetShard):
            shard = self.dataset
        self._init_prepared(shard, device, non_blocking, rng_types, gradient_state, synchronized_generator,
                            exact_resume)
        self._accelerate_keywords(accelerate_keywords)

    def __len__(self) -> int:
        full = self.dataset.num_steps() if isinstance(self.dataset, IterableDatasetShard) else self._base.__len__(self)
        return self._remaining(full)

    def _raw_batches(self, skip: int) -> Iterator[Any]:
        by_index = isinstance(self.batch_sampler, BatchSamplerShard)
        if by_index:
            self.batch_sampler.skip_batches = skip  # skip indices, never load the skipped samples
        raw = self._base_iter()
        if skip and not by_index:
            raw = itertools.islice(raw, skip, None)  # iterable data: skipping means reading
        return raw

    def _batches(self, skip: int) -> Iterator[tuple[Any, bool]]:
        return with_last_flag(self._place(batch) for batch in self._raw_batches(skip))

    # DataLoader annotates __iter__ with its own iterator class; a prepared loader yields from a generator
    def __iter__(self) -> Iterator[Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        # The mixin's bookkeeping in one generator, over DataLoader's own iterator: the hot path of every
        # training loop, so one generator frame per batch and no call where a batch needs no move.
        skip = self._begin()
        attributes = self.__dict__  # counting in it skips DataLoader's __setattr__, a Python call per batch
        place = self._place if self._moves_batches else None
        try:
            raw = self._raw_batches(skip)
            current = next(raw, _END)  # each batch is handed out once the next one exists (or the data ended)
            if current is _END:
                return
            if place is not None:
                current = place(current)
            for upcoming in raw:
                attributes["batches_yielded"] += 1
                yield current
                current = upcoming if place is None else place(upcoming)
            attributes["batches_yielded"] += 1
            self._reached_end()
            yield current
            self._join_remaining_gathers()
        finally:
            self.gradient_state._remove_dataloader(self)


class SkipDataLoader(DataLoader):
    """A plain ``DataLoader`` that reads and drops the first ``skip_batches`` batches of every iteration
    (for iterable datasets, where batches cannot be skipped by index)."""

    use_stateful_dataloader = False
    base_dataloader = SelfReference()

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        del args, kwargs  # for __init__
        return object.__new__(stateful_loader_class(cls, reads_ahead=False) if use_stateful_dataloader else cls)

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 **dataloader_kwargs: Any) -> None:
        del use_stateful_dataloader  # chose the class (__new__)
        super().__init__(dataset, **dataloader_kwargs)
        self.skip_batches = skip_batches

    # DataLoader annotates __iter__ with its own iterator class; this one yields from a generator
    def __iter__(self) -> Iterator[Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        yield from itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)
