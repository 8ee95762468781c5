"""Samplers and dataset wrappers that give each process its share of one epoch.

The rule everywhere: step ``s`` of process ``i`` holds what a single process would get as batch
``s * n + i`` (or slice ``i`` of batch ``s`` with ``split_batches``), so concatenating the processes'
batches of one step reproduces the single-process order. ``even_batches`` fills the last step by wrapping
around to the first samples of the epoch; nothing is padded with one process, where there is nothing to
even out.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order is a pure function of ``(seed, epoch)``.

    Every process that holds the same seed draws the same permutation, whatever the world size, and
    the order of any epoch can be recomputed (which makes mid-epoch resume exact)::

        sampler = SeedableRandomSampler(dataset, seed=42)
        sampler.set_epoch(3)
        order = list(sampler)  # the same in every process and every run

    Accelerate's signature works too: ``data_seed`` is the seed (default: torch's initial seed, read when the
    sampler is made), a ``generator`` given is re-seeded with ``seed + epoch`` at each epoch, and a full
    pass moves the sampler to the next epoch (a prepared loader sets the epoch itself at each iteration).
    """

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: torch.Generator | None = None, seed: int | None = None, epoch: int = 0,
                 data_seed: int | None = None) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        if seed is None:
            seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.seed = int(seed)
        self.epoch = int(epoch)

    @property
    def initial_seed(self) -> int:
        """The seed (Accelerate's name for it)."""
        return self.seed

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order at the next iteration."""
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        """This epoch's whole order, the indices iterating yields, as one list."""
        return self.order_tensor().tolist()

    def order_tensor(self) -> torch.Tensor:
        """This epoch's whole order as a 1-D int64 tensor (a sharded loader cuts its batches from it in C)."""
        # Re-seeded per epoch: the order never depends on how much was drawn before.
        generator = self.generator if self.generator is not None else torch.Generator()
        generator.manual_seed((self.seed + self.epoch) % 2**64)
        size = len(self.data_source)
        if self.replacement:
            return torch.randint(size, (self.num_samples,), generator=generator)
        parts = [torch.randperm(size, generator=generator) for _ in range(self.num_samples // size)]
        if self.num_samples % size:
            parts.append(torch.randperm(size, generator=generator)[: self.num_samples % size])
        return _joined(parts)

    def _next_epoch(self) -> Iterator[int]:
        self.epoch += 1  # reached only once the epoch's order was read to its end
        yield from ()

    def __iter__(self) -> Iterator[int]:
        # The list's own iterator, chained in C: a generator per index would cost a frame resume per sample,
        # which the batch sampler (and a sharded loader, which reads the whole order at each epoch's start)
        # pays for every sample. The trailing generator runs once, after the last index.
        return itertools.chain(self.order(), self._next_epoch())


def batches_per_process(num_batches: int, num_processes: int, process_index: int, split_batches: bool,
                        drop_last: bool, even_batches: bool, last_batch_size: int | None = None,
                        batch_size: int | None = None) -> int:
    """How many batches process ``process_index`` yields from ``num_batches`` original batches.

    ``last_batch_size`` (the size of the last original batch) matters only with ``split_batches`` and
    uneven batches, where processes whose slice of a short last batch is empty yield one batch less.
    """
    n = num_processes
    if split_batches:
        if drop_last or even_batches or last_batch_size is None or batch_size is None:
            return num_batches
        return num_batches - (1 if last_batch_size <= process_index * (batch_size // n) else 0)
    if drop_last:
        return num_batches // n
    if even_batches:
        return math.ceil(num_batches / n)
    return num_batches // n + (1 if process_index < num_batches % n else 0)


def _check_split(batch_size: int | None, num_processes: int) -> None:
    if batch_size is None:
        raise ValueError("split_batches=True needs a batch sampler with a `batch_size` attribute; use a "
                         "torch BatchSampler (DataLoader(batch_size=...)) or split_batches=False")
    if batch_size % num_processes:
        raise ValueError(f"split_batches=True needs a batch size that is a round multiple of the number of "
                         f"processes, got batch_size={batch_size} and num_processes={num_processes}; use a batch "
                         f"size that is a multiple of {num_processes}, or split_batches=False")


def _check_index(num_processes: int, process_index: int) -> None:
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index} is not valid with num_processes={num_processes}: it "
                         f"must be in 0..{num_processes - 1} (and num_processes >= 1)")


class BatchSamplerShard(Sampler[list[int]]):
    """Process ``process_index``'s share of the batches of ``batch_sampler``.

    Without ``split_batches`` process ``i`` takes batches ``i, i + n, i + 2n, ...``; with it, slice ``i``
    of every batch (the batch size must divide by ``n``). ``even_batches`` gives every process the same
    number of full batches by wrapping around to the start of the epoch (not when the batch sampler drops
    its last batch); otherwise the last batch may be short or missing on some processes.

    ``skip_batches`` (set by the prepared loader to resume) drops this process's first batches at the
    index level, without loading their samples.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], num_processes: int = 1, process_index: int = 0,
                 split_batches: bool = False, even_batches: bool = True) -> None:
        _check_index(num_processes, process_index)
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.skip_batches = 0
        if split_batches:
            _check_split(self.batch_size, num_processes)

    @property
    def per_process_batch_size(self) -> int | None:
        """The size of the batches this process yields (``None`` if the batch sampler has no size)."""
        if self.batch_size is None:
            return None
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    @property
    def total_batch_size(self) -> int | None:
        """The global batch size of one step, over all processes."""
        if self.batch_size is None:
            return None
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped batch sampler and its sampler, each that takes one."""
        for target in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            set_epoch = getattr(target, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)

    def _last_batch_size(self) -> int | None:
        sampler = getattr(self.batch_sampler, "sampler", None)
        if self.batch_size is None or self.drop_last or not isinstance(sampler, Sized):
            return None
        num_samples = len(sampler)
        return num_samples - (math.ceil(num_samples / self.batch_size) - 1) * self.batch_size

    def num_steps(self, process_index: int | None = None) -> int:
        """Batches process ``process_index`` (default: this one) yields per epoch."""
        index = self.process_index if process_index is None else process_index
        return batches_per_process(_length(self.batch_sampler, "batch sampler"), self.num_processes, index, self.split_batches,
                                   self.drop_last, self.even_batches, self._last_batch_size(), self.batch_size)

    def __len__(self) -> int:
        return self.num_steps()

    def __iter__(self) -> Iterator[list[int]]:
        if _plain_batches(self.batch_sampler) and (self.num_processes == 1 or not self.split_batches):
            # cut on the first next(), not here: DataLoader makes this iterator before it draws its base seed,
            # and the order must be drawn after that seed, as iterating the batch sampler draws it
            return itertools.chain.from_iterable(self._epoch_at_first_next())
        if self.num_processes == 1:
            # Nothing to shard or even out: the batch sampler's own batches, with no generator of ours
            # between them and the DataLoader (this runs once per batch of every one-process loop).
            batches = iter(self.batch_sampler)
            return itertools.islice(batches, self.skip_batches, None) if self.skip_batches else batches
        return self._own_batches()

    def _epoch_at_first_next(self) -> Iterator[Iterator[list[int]]]:
        yield self._own_batches_at_once()

    def _own_batches_at_once(self) -> Iterator[list[int]]:
        """This process's batches of the epoch, cut from the epoch's index order in one go: the same batches as
        ``_own_batches``, without walking the batch sampler (whose sampler resumes a generator per index) or the
        other processes' batches. The order stays a tensor: only this process's indices of the complete rounds
        become Python ints (one ``tolist()`` of a strided view), and each batch's list is sliced from them when
        the DataLoader asks for it, as torch's BatchSampler makes one list per batch (a hundred lists made at the
        epoch's start cost the bench's 2-process loader 0.5% in gen-0 garbage collections alone). What a pass
        draws after its last index is drawn where the batch sampler would reach its end: after the complete
        rounds, before a last incomplete one."""
        n, size, me = self.num_processes, self.batch_size, self.process_index
        batch_sampler = self.batch_sampler
        # __iter__ comes here only for torch's own BatchSampler (_plain_batches), which has a batch size
        assert isinstance(batch_sampler, BatchSampler) and size is not None
        sampler = batch_sampler.sampler
        order = _epoch_order_tensor(sampler)
        at_end = _after_last_index(sampler)
        total = order.numel()
        rounds = total // (size * n)  # complete rounds: every process a whole batch
        whole = rounds * size * n
        mine = order[:whole].view(rounds, n, size)[:, me].reshape(-1).tolist()
        skip = self.skip_batches
        cuts = range(min(skip, rounds) * size, (rounds + 1) * size, size)  # batch k is mine[cuts[k]:cuts[k + 1]]
        batches: Iterator[list[int]] = map(mine.__getitem__, map(slice, cuts, cuts[1:]))
        if whole == total:
            return itertools.chain(batches, at_end)
        rest = order[whole:].tolist()
        group = [rest[i:i + size] for i in range(0, len(rest), size)]
        if self.drop_last and len(group[-1]) < size:
            group.pop()  # the batch sampler drops its short last batch
        if not group:
            return itertools.chain(batches, at_end)
        head = order[:min(n * size, total)].tolist()
        first = [head[i:i + size] for i in range(0, len(head), size)]
        last = [part for parts in self._last_whole_round(group, first) for part in (parts[me],) if part is not None]
        return itertools.chain(batches, at_end, last[max(skip - rounds, 0):])

    def _own_batches(self) -> Iterator[list[int]]:
        skip = self.skip_batches
        for step, parts in enumerate(self.rounds()):
            part = parts[self.process_index]
            if part is None:
                return
            if step >= skip:
                yield part

    def rounds(self) -> Iterator[Sequence[list[int] | None]]:
        """Every step of the epoch as the list of each process's batch (``None``: no batch)."""
        return self._split_rounds() if self.split_batches else self._whole_rounds()

    def _whole_rounds(self) -> Iterator[Sequence[list[int] | None]]:
        n = self.num_processes
        first: list[list[int]] = []  # the epoch's first batches: the source of wrap-around samples
        group: list[list[int]] = []
        size = self.batch_size
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(first) < n:
                first.append(batch)
            group.append(batch)
            # A round goes out as soon as it is whole and its last batch full, as Accelerate's shard yields it
            # (reading no further: a sampler that draws as it goes draws at the same batches); only the last
            # round can be incomplete or end short, and it waits for the data's end.
            if len(group) == n and (size is None or len(batch) == size):
                yield group
                group = []
        if group:
            yield from self._last_whole_round(group, first)

    def _last_whole_round(self, group: list[list[int]],
                          first: list[list[int]]) -> Iterator[Sequence[list[int] | None]]:
        n, size = self.num_processes, self.batch_size
        if n == 1 or (len(group) == n and (size is None or len(group[-1]) == size)):
            yield group
        elif self.drop_last:
            return
        elif not self.even_batches:
            yield group + [None] * (n - len(group))
        elif size is None:  # batch sizes unknown: missing processes get whole batches from the start
            yield group + [first[k % len(first)] for k in range(n - len(group))]
        else:
            samples = [index for batch in group for index in batch]
            samples += _wrap([index for batch in first for index in batch], n * size - len(samples))
            yield [samples[p * size:(p + 1) * size] for p in range(n)]

    def _split_rounds(self) -> Iterator[Sequence[list[int] | None]]:
        n, size = self.num_processes, self.batch_size
        assert size is not None  # checked in __init__
        per = size // n
        first: list[int] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(first) < size:
                first.extend(batch[: size - len(first)])
            if len(batch) < size and n > 1:  # a short batch can only be the last one
                if self.drop_last:
                    return
                if self.even_batches:
                    batch = batch + _wrap(first, size - len(batch))
            yield [batch[p * per:(p + 1) * per] or None for p in range(n)]


def _plain_batches(batch_sampler: Any) -> bool:
    """Whether ``batch_sampler`` is torch's own BatchSampler over a sampler whose whole epoch can be drawn up
    front with every random number drawn as iterating it draws them: a ``SequentialSampler``, a
    ``SeedableRandomSampler``, or a ``RandomSampler`` of one permutation an epoch (no replacement, ``num_samples``
    the data's length; otherwise it draws more as its indices are read, which a generator shared with the
    training loop would see)."""
    if type(batch_sampler) is not BatchSampler:
        return False
    sampler = batch_sampler.sampler
    if type(sampler) is RandomSampler:
        return not sampler.replacement and sampler.num_samples == len(sampler.data_source) > 0
    return type(sampler) in (SequentialSampler, SeedableRandomSampler)


def _epoch_order(sampler: Any) -> list[int]:
    """The indices one pass over ``sampler`` (a ``_plain_batches`` sampler) yields, as one list, with what the
    pass draws after its last index drawn too."""
    order = _epoch_order_tensor(sampler).tolist()
    for _ in _after_last_index(sampler):
        pass
    return order


def _epoch_order_tensor(sampler: Any) -> torch.Tensor:
    """The indices one pass over ``sampler`` (a ``_plain_batches`` sampler) yields, as a 1-D int64 tensor, drawn
    from the same random numbers in the same order; what the pass draws after its last index is left to
    ``_after_last_index``."""
    if type(sampler) is SeedableRandomSampler:
        return sampler.order_tensor()
    if type(sampler) is RandomSampler:
        generator = sampler.generator
        if generator is None:  # as torch's sampler: a fresh generator seeded from the global one
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return torch.randperm(len(sampler.data_source), generator=generator)
    return torch.arange(len(sampler.data_source))


def _after_last_index(sampler: Any) -> Iterator[list[int]]:
    """Yields nothing; reached, it does what a pass over ``sampler`` does after its last index. Torch's
    ``RandomSampler`` draws one more permutation and uses none of it (this moves its generator: drawn only when
    the sampler keeps one; a generator made for the pass is dropped with it); a ``SeedableRandomSampler`` moves
    to its next epoch."""
    if type(sampler) is SeedableRandomSampler:
        sampler.set_epoch(sampler.epoch + 1)
    elif type(sampler) is RandomSampler and sampler.generator is not None:
        _draw_as_randperm(len(sampler.data_source), sampler.generator)
    yield from ()


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _draw_as_randperm(size: int, generator: torch.Generator) -> None:
    """Leave ``generator`` as ``torch.randperm(size, generator=generator)`` leaves it, at half the cost: on the
    CPU, randperm draws ``size - 1`` 32-bit numbers (one per Fisher-Yates swap), as many as filling a uint8
    tensor of that length with ``random_``, without the divisions and swaps. Checked against randperm once per
    process (``_fill_draws_as_randperm``); any other case draws the permutation itself."""
    if size > 1 and generator.device.type == "cpu" and size < 2**32 // 20 and _fill_draws_as_randperm():
        torch.empty(size - 1, dtype=torch.uint8).random_(generator=generator)
    else:
        torch.randperm(size, generator=generator)


@functools.cache
def _fill_draws_as_randperm() -> bool:
    """Whether this torch's ``random_`` of ``k`` uint8 values leaves a CPU generator where ``randperm(k + 1)`` does."""
    a, b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    torch.randperm(1001, generator=a)
    torch.empty(1000, dtype=torch.uint8).random_(generator=b)
    return torch.equal(a.get_state(), b.get_state())


def _length(items: object, what: str) -> int:
    """``len(items)``; a TypeError naming ``items`` (a ``what``) when it has no ``__len__``."""
    if not isinstance(items, Sized):
        raise TypeError(f"the {what} {type(items).__name__} has no __len__, so the number of batches per "
                        "process is unknown; give it a __len__ or iterate without len()")
    return len(items)


def _wrap(pool: list[Any], count: int) -> list[Any]:
    """``count`` items taken from ``pool`` cyclically, from its start."""
    return [pool[k % len(pool)] for k in range(count)] if count > 0 else []


class SkipBatchSampler(Sampler[list[int]]):
    """``batch_sampler`` without its first ``skip_batches`` batches (skipped by index, never loaded)."""

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(_length(self.batch_sampler, "batch sampler") - self.skip_batches, 0)


class DispatchBatchSampler(Sampler[list[int]]):
    """What the dispatching process loads for a map-style dataset: every process's batch of each step
    in turn (each collated on its own), or, with ``split_batches``, each step's whole global batch.

    The shard's rounds do the padding (``even_batches``) at the index level, so the dispatcher only
    groups and slices. ``skip_steps`` drops the first steps by index.
    """

    def __init__(self, shard: BatchSamplerShard) -> None:
        self.shard = shard
        self.skip_steps = 0

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the shard of batches it dispatches (its order follows the epoch)."""
        self.shard.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for step, parts in enumerate(self.shard.rounds()):
            if step < self.skip_steps:
                continue
            present = [part for part in parts if part is not None]
            if self.shard.split_batches:
                yield [index for part in present for index in part]
            else:
                yield from present


def _chunks(iterable: Iterable[Any], size: int, drop_last: bool, pad: bool) -> Iterator[list[Any]]:
    """``iterable`` in lists of ``size``; the short last one is dropped, padded from the first samples,
    or kept as it is."""
    first: list[Any] = []  # the first samples of the epoch: the source of wrap-around samples
    chunk: list[Any] = []
    for sample in iterable:
        if len(first) < size:
            first.append(sample)
        chunk.append(sample)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk and not drop_last:
        yield chunk + (_wrap(first, size - len(chunk)) if pad else [])


class IterableDatasetShard(IterableDataset):
    """Process ``process_index``'s share of an iterable dataset that every process reads in full.

    The stream is cut into global batches (``batch_size * num_processes`` samples, or ``batch_size``
    with ``split_batches``), and this process keeps its contiguous slice of each. At the end:
    ``drop_last`` drops a short global batch; else it is completed with samples from the start of the
    epoch. ``even_batches`` is kept for Accelerate's signature and changes nothing here, as in Accelerate.
    """

    def __init__(self, dataset: Iterable[Any], batch_size: int = 1, drop_last: bool = False,
                 num_processes: int = 1, process_index: int = 0, split_batches: bool = False,
                 even_batches: bool = True) -> None:
        _check_index(num_processes, process_index)
        if split_batches:
            _check_split(batch_size, num_processes)
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.epoch = 0

    @property
    def even_batches(self) -> bool:
        """Always ``True``: every process gets the same number of batches (a value set is ignored, as
        Accelerate ignores ``even_batches`` for iterable data)."""
        return True

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        del value  # accepted for Accelerate's signature and join_uneven_inputs; see the getter

    @property
    def per_process_batch_size(self) -> int:
        """The batch size each process gets."""
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    @property
    def total_batch_size(self) -> int:
        """The batch size over all processes."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` and pass it on to the dataset if it takes one (e.g. to reshuffle)."""
        self.epoch = epoch
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def _pad(self) -> bool:
        # As Accelerate: a stream is always completed with samples from its start when several processes
        # read it, whatever ``even_batches`` says (it only shapes map-style data): processes that stopped
        # at different steps would leave collectives unmatched.
        return self.num_processes > 1

    def num_steps(self, process_index: int | None = None) -> int:
        """Batches a process yields per epoch (needs a dataset with ``len``)."""
        index = self.process_index if process_index is None else process_index
        total, per = self.total_batch_size, self.per_process_batch_size
        full, rest = divmod(_length(self.dataset, "dataset"), total)
        if self.drop_last or rest == 0:
            return full
        return full + (1 if self._pad() or rest > index * per else 0)

    def __len__(self) -> int:
        """Samples this process yields per epoch (needs a dataset with ``len``)."""
        total, per = self.total_batch_size, self.per_process_batch_size
        full, rest = divmod(_length(self.dataset, "dataset"), total)
        if self.drop_last or rest == 0:
            return full * per
        tail = per if self._pad() else min(max(rest - self.process_index * per, 0), per)
        return full * per + tail

    def __iter__(self) -> Iterator[Any]:
        per = self.per_process_batch_size
        start = self.process_index * per
        for chunk in _chunks(self.dataset, self.total_batch_size, self.drop_last, self._pad()):
            yield from chunk[start:start + per]


class DispatchedIterable(IterableDatasetShard):
    """The whole global stream (a short last global batch dropped with ``drop_last``, else kept as it is),
    for the one process that reads and dispatches: the dispatcher evens out the last batch itself."""

    def __len__(self) -> int:
        total = self.total_batch_size
        full, rest = divmod(_length(self.dataset, "dataset"), total)
        return full * total + (0 if self.drop_last else rest)

    def __iter__(self) -> Iterator[Any]:
        for chunk in _chunks(self.dataset, self.total_batch_size, self.drop_last, pad=False):
            yield from chunk
