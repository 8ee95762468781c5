"""Dispatching: rank 0 alone reads the data and sends every process its part of each step.

Per step, rank 0 broadcasts one small header (each process's batch with its tensors replaced by slots,
and which process gets its last batch now), then scatters each process's tensors as one byte buffer.
The other processes never touch the dataset.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from overdrive.data.loader import (
    _ACCELERATE_KEYWORDS,
    PreparedLoaderMixin,
    _distributed,
    loader_settings,
    with_last_flag,
)
from overdrive.data.sampler import (
    BatchSamplerShard,
    DispatchBatchSampler,
    DispatchedIterable,
    IterableDatasetShard,
    _check_index,
)
from overdrive.helpers.ops import honor_mapping, honor_type
from overdrive.runtime import group
from overdrive.training.state import GradientState


def _is_leaf_sequence(data: Any) -> bool:
    """A list of per-sample values (strings, numbers), as opposed to a structure of tensors."""
    return isinstance(data, (list, tuple)) and not any(
        isinstance(item, (torch.Tensor, Mapping, list, tuple)) for item in data)


def _find_length(data: Any) -> int | None:
    if isinstance(data, torch.Tensor):
        return data.shape[0] if data.dim() else None
    if _is_leaf_sequence(data):
        return len(data)
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for item in items:
        length = _find_length(item)
        if length is not None:
            return length
    return None


def slice_batch(data: Any, tensor_slice: slice, process_index: int | None = None,
                num_processes: int | None = None) -> Any:
    """Slice every tensor and every list of per-sample values in ``data`` along the first dimension
    (the default ``slice_fn_for_dispatch``; the process arguments are there for custom ones)."""
    if isinstance(data, torch.Tensor):
        return data[tensor_slice] if data.dim() else data
    if _is_leaf_sequence(data):
        return data[tensor_slice]
    if isinstance(data, Mapping):
        return honor_mapping(data, {key: slice_batch(value, tensor_slice) for key, value in data.items()})
    if isinstance(data, (list, tuple)):
        return honor_type(data, (slice_batch(item, tensor_slice) for item in data))
    return data


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lies in the byte buffer of a step."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _pack(data: Any, tensors: list[torch.Tensor], offset: list[int]) -> Any:
    """``data`` with each tensor replaced by a ``_Slot``; the tensors are appended to ``tensors``."""
    if isinstance(data, torch.Tensor):
        nbytes = data.numel() * data.element_size()
        slot = _Slot(offset[0], nbytes, tuple(data.shape), data.dtype)
        offset[0] += nbytes
        tensors.append(data)
        return slot
    if isinstance(data, Mapping):
        return honor_mapping(data, {key: _pack(value, tensors, offset) for key, value in data.items()})
    if isinstance(data, (list, tuple)):
        return honor_type(data, (_pack(item, tensors, offset) for item in data))
    return data


def _unpack(data: Any, buffer: torch.Tensor | None) -> Any:
    if isinstance(data, _Slot):
        assert buffer is not None  # a step holding a tensor has a byte buffer (size > 0)
        # clone: a fresh, aligned storage per tensor, and no view keeping the whole step buffer alive
        raw = buffer[data.offset:data.offset + data.nbytes].clone()
        return raw.view(data.dtype).reshape(data.shape)
    if isinstance(data, Mapping):
        return honor_mapping(data, {key: _unpack(value, buffer) for key, value in data.items()})
    if isinstance(data, (list, tuple)):
        return honor_type(data, (_unpack(item, buffer) for item in data))
    return data


def _to_bytes(tensors: list[torch.Tensor], size: int, device: torch.device) -> torch.Tensor:
    buffer = torch.zeros(size, dtype=torch.uint8, device=device)
    offset = 0
    for tensor in tensors:
        flat = tensor.detach().to(device).contiguous().reshape(-1).view(torch.uint8)
        buffer[offset:offset + flat.numel()] = flat
        offset += flat.numel()
    return buffer


def _comm_device(device: torch.device | str | None) -> torch.device:
    """Where the process group moves tensors: the CPU on gloo/mpi, else the accelerator."""
    backend = str(dist.get_backend())
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if device is not None and torch.device(device).type != "cpu":
        return torch.device(device)
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


class DataLoaderDispatcher(PreparedLoaderMixin, DataLoader):
    """A ``DataLoader`` whose data is read by rank 0 only and dispatched, one part per process.

    Built by :func:`prepare_data_loader` with ``dispatch_batches=True`` (the default for iterable
    datasets), around a :class:`DispatchBatchSampler` (map-style) or a :class:`DispatchedIterable`.
    Process ``i`` receives exactly what a :class:`DataLoaderShard` would give it. Every step is a
    collective: all processes must iterate together (and stop at the same step if they break early).
    """

    def __init__(self, dataset: Any, num_processes: int = 1, process_index: int = 0, split_batches: bool = False,
                 slice_fn: Callable[..., Any] | None = None, device: torch.device | str | None = None,
                 rng_types: list[Any] | None = None, non_blocking: bool = False,
                 gradient_state: GradientState | None = None, exact_resume: bool = False,
                 **dataloader_kwargs: Any) -> None:
        accelerate_keywords = {k: dataloader_kwargs.pop(k) for k in _ACCELERATE_KEYWORDS if k in dataloader_kwargs}
        non_blocking = bool(accelerate_keywords.get("_non_blocking", non_blocking))
        _check_index(num_processes, process_index)
        dataset, dataloader_kwargs = _dispatch_inputs(dataset, dataloader_kwargs, num_processes, split_batches)
        self._base.__init__(self, dataset, **dataloader_kwargs)
        if isinstance(self.batch_sampler, DispatchBatchSampler):
            shard: Any = self.batch_sampler.shard
        elif isinstance(self.dataset, IterableDatasetShard):
            shard = self.dataset
        elif num_processes == 1 and self.batch_sampler is not None:  # made directly: the batches as they are
            shard = BatchSamplerShard(self.batch_sampler, 1, 0, split_batches)
        else:
            raise TypeError("DataLoaderDispatcher needs a DispatchBatchSampler (map-style data) or a "
                            "DispatchedIterable (iterable data); build it with prepare_data_loader(..., "
                            "dispatch_batches=True)")
        if num_processes > 1 and not _distributed():
            raise RuntimeError(f"dispatch_batches=True with num_processes={num_processes} needs an initialized "
                               "torch.distributed process group of more than one process; initialize it first, "
                               "or use dispatch_batches=False")
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.slice_fn = slice_fn or slice_batch
        self._dp_of_rank: list[int] | None = None
        object.__setattr__(self, "batch_size", shard.per_process_batch_size)
        self._init_prepared(shard, device, non_blocking, rng_types, gradient_state, exact_resume=exact_resume)
        self._accelerate_keywords(accelerate_keywords)

    def __len__(self) -> int:
        return self._remaining(self._shard.num_steps(self.process_index))

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch; for a stream of unknown length, those rank 0 counted."""
        # every rank learns it from the last step's header; a lone process counted it itself
        observed = self.__dict__.get("_final_remainder", self.__dict__.get("_observed"))
        return observed if observed is not None else super().remainder

    # -- rank 0: reading and cutting into steps ---------------------------------------------------
    def _read_steps(self, skip: int) -> Iterator[list[Any]]:
        """Each step as the list of every process's batch (``None``: that process has none)."""
        if isinstance(self.batch_sampler, DispatchBatchSampler):
            self.batch_sampler.skip_steps, skip = skip, 0  # map-style: skip by index
        batches = self._base_iter()
        return itertools.islice(self._group(batches), skip, None)

    def _read_per_step(self) -> int:
        return 1 if self.split_batches else self.num_processes

    def _group(self, batches: Iterator[Any]) -> Iterator[list[Any]]:
        n = self.num_processes
        stream = isinstance(self.dataset, IterableDatasetShard)
        self._first, self._observed = None, None
        if self.split_batches:
            for batch in batches:
                yield self._even_out([batch]) if stream else self._split(batch)
            return
        while group := list(itertools.islice(batches, n)):
            if stream and (self._first is None or len(group) < n or _find_length(group[-1]) != self.batch_size):
                yield self._even_out(group)  # the epoch's first step (its samples pad the last) or its last
            else:
                yield group + [None] * (n - len(group))

    def _even_out(self, batches: list[Any]) -> list[Any]:
        """One step of a stream as Accelerate dispatches it: the batches joined, cut into ``num_processes``
        equal parts of ``ceil(samples / num_processes)``, a short last step padded with the epoch's first
        samples. A full step keeps the batches as collated (each process's batch as it was read)."""
        n = self.num_processes
        joined = batches[0] if len(batches) == 1 else _join(batches)
        observed = _find_length(joined)
        if observed is None:
            raise TypeError(f"cannot split a batch of type {type(joined).__name__} between processes: it holds "
                            "no tensor or list with a first dimension; pass slice_fn_for_dispatch")
        if self._first is None:
            self._first = self.slice_fn(joined, slice(0, n), process_index=0, num_processes=n)
        if observed == (self.batch_size or 1) * n:
            return batches if len(batches) == n else self._split_into(joined, self.batch_size or 1)
        self._observed = observed  # the real samples of this (last) step: gather_for_metrics keeps these
        if observed % n:
            joined = _join([joined, self._first])
        return self._split_into(joined, -(-observed // n))

    def _split_into(self, batch: Any, per: int) -> list[Any]:
        n = self.num_processes
        return [self.slice_fn(batch, slice(p * per, (p + 1) * per), process_index=p, num_processes=n)
                for p in range(n)]

    def _split(self, batch: Any) -> list[Any]:
        length = _find_length(batch)
        if length is None:
            raise TypeError(f"cannot split a batch of type {type(batch).__name__} between processes: it holds "
                            "no tensor or list with a first dimension; pass slice_fn_for_dispatch")
        per, n = self.batch_size or 1, self.num_processes
        return [self.slice_fn(batch, slice(p * per, (p + 1) * per), process_index=p, num_processes=n)
                if p * per < length else None for p in range(n)]

    # -- every rank: one message per step -------------------------------------------------------
    def _batches(self, skip: int) -> Iterator[tuple[Any, bool]]:
        if not _distributed():  # one process: it reads and keeps everything
            return with_last_flag(self._place(parts[0]) for parts in self._read_steps(skip))
        return self._exchange(skip)

    def _dp_indices(self) -> list[int]:
        """Each global rank's process index (tensor parallelism can give several ranks the same one)."""
        if self._dp_of_rank is None:
            gathered: list[Any] = [None] * group.world_size()
            dist.all_gather_object(gathered, self.process_index)
            missing = sorted(set(range(self.num_processes)) - set(gathered))
            if missing:
                raise ValueError(f"the processes' process_index values {gathered} leave indices {missing} of "
                                 f"num_processes={self.num_processes} with no process")
            self._dp_of_rank = [int(index) for index in gathered]
        return self._dp_of_rank

    def _exchange(self, skip: int) -> Iterator[tuple[Any, bool]]:
        dp_of_rank = self._dp_indices()
        is_reader = group.rank() == 0
        device = _comm_device(self.device)
        steps = _with_next(self._read_steps(skip)) if is_reader else None
        while True:
            parts, buffers, header = (self._next_message(steps, dp_of_rank, device) if steps is not None
                                      else (None, None, None))
            box: list[Any] = [header]
            dist.broadcast_object_list(box, src=0)
            message: dict[str, Any] = box[0]  # rank 0's header, on every rank
            size = message["size"]
            received = None
            if size:
                received = torch.empty(size, dtype=torch.uint8, device=device)
                dist.scatter(received, buffers, src=0)
            me = self.process_index
            if message["skeletons"][me] is None:
                return
            part = parts[me] if parts is not None else _unpack(message["skeletons"][me], received)
            if message["final"]:
                self._final_remainder = message["remainder"]
            yield self._place(part), message["last"][me]
            if message["final"]:
                return

    def _next_message(self, steps: Iterator[tuple[list[Any], list[Any] | None]], dp_of_rank: list[int],
                      device: torch.device) -> tuple[list[Any], list[torch.Tensor], dict[str, Any]]:
        n = self.num_processes
        parts, upcoming = next(steps, ([None] * n, None))
        final = upcoming is None
        skeletons, tensors = [], []
        for part in parts:
            found: list[torch.Tensor] = []
            skeletons.append(None if part is None else _pack(part, found, [0]))
            tensors.append(found)
        sizes = [sum(t.numel() * t.element_size() for t in found) for found in tensors]
        size = max(sizes[dp] for dp in dp_of_rank)
        buffers = [_to_bytes(tensors[dp], size, device) for dp in dp_of_rank] if size else []
        # A process's batch is its last when the next step has none for it, or there is no next step.
        last = [upcoming is None or upcoming[p] is None for p in range(n)]
        remainder = getattr(self, "_observed", None) if final else None
        header = {"skeletons": skeletons, "last": last, "final": final, "size": size, "remainder": remainder}
        return parts, buffers, header


def _dispatch_inputs(dataset: Any, kwargs: dict[str, Any], num_processes: int,
                     split_batches: bool) -> tuple[Any, dict[str, Any]]:
    """The dataset and DataLoader keywords of a dispatcher made directly from plain ones (Accelerate's
    ``DataLoaderDispatcher(dataset, batch_size=4)``): rank 0's view of every process's batches."""
    if isinstance(kwargs.get("batch_sampler"), DispatchBatchSampler) or isinstance(dataset, IterableDatasetShard):
        return dataset, kwargs  # built by prepare_data_loader
    plain = DataLoader(dataset, **kwargs)
    settings = loader_settings(plain)
    if isinstance(dataset, IterableDataset):
        batch_size = plain.batch_size or 1
        stream = DispatchedIterable(dataset, batch_size, plain.drop_last, num_processes, 0, split_batches)
        return stream, {**settings, "batch_size": batch_size, "drop_last": plain.drop_last}
    if num_processes == 1:  # nothing to group: torchdata sees (and saves the state of) the plain batch sampler
        return dataset, kwargs
    assert plain.batch_sampler is not None  # a map-style DataLoader always has one
    rounds = BatchSamplerShard(plain.batch_sampler, num_processes, 0, split_batches)
    return dataset, {**settings, "batch_sampler": DispatchBatchSampler(rounds)}


def _join(batches: list[Any]) -> Any:
    """Batches joined along their first dimension (lists of per-sample values are chained)."""
    first = batches[0]
    if _is_leaf_sequence(first):
        return honor_type(first, (item for batch in batches for item in batch))
    if isinstance(first, Mapping):
        return cast(Any, type(first))({key: _join([batch[key] for batch in batches]) for key in first})
    if isinstance(first, (list, tuple)):
        return honor_type(first, (_join([batch[i] for batch in batches]) for i in range(len(first))))
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.dim() else first
    return first


def _with_next(steps: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """``(step, next step or None)``: rank 0 reads one step ahead to know which batches are last."""
    current = next(steps, None)
    while current is not None:
        upcoming = next(steps, None)
        yield current, upcoming
        current = upcoming
