"""``prepare_data_loader`` and ``skip_first_batches``: turn a user's DataLoader into a prepared one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset

from overdrive.data.loader import DataLoaderShard, PreparedLoaderMixin, SkipDataLoader, loader_settings
from overdrive.data.sampler import (
    BatchSamplerShard,
    DispatchBatchSampler,
    DispatchedIterable,
    IterableDatasetShard,
    SkipBatchSampler,
)
from overdrive.data.shuffling import accelerate_shuffling, seedable_batch_sampler
from overdrive.data.stateful import stateful_loader_class
from overdrive.runtime import group
from overdrive.training.state import GradientState

if TYPE_CHECKING:
    from overdrive.data.dispatch import DataLoaderDispatcher


def _data_parallel_place(mesh: Any) -> tuple[int, int]:
    """(size, index) of this process along the data-parallel axes of a device mesh."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    axes = ["dp"] if "dp" in names else [name for name in ("dp_replicate", "dp_shard") if name in names]
    size, index = 1, 0
    for axis in axes:
        sub = mesh[axis]
        index = index * sub.size() + sub.get_local_rank()
        size *= sub.size()
    return size, index


def _processes(num_processes: int | None, process_index: int | None, mesh: Any) -> tuple[int, int]:
    if num_processes is not None and process_index is not None:
        return num_processes, process_index  # given (e.g. the data-parallel place): never the global rank
    if mesh is not None:
        size, index = _data_parallel_place(mesh)
    else:
        size, index = group.world_size(), group.rank()
    return (size if num_processes is None else num_processes), (index if process_index is None else process_index)


def _native_shard(dataset: Any, num_processes: int, process_index: int, split_batches: bool) -> Any:
    """Process ``process_index``'s shards of a ``datasets.IterableDataset`` with at least ``num_processes``
    shards (Accelerate uses the library's own sharding then), else ``None``."""
    if num_processes == 1 or split_batches or not type(dataset).__module__.startswith("datasets."):
        return None
    if getattr(dataset, "n_shards", 0) < num_processes or not hasattr(dataset, "shard"):
        return None
    return dataset.shard(num_shards=num_processes, index=process_index)


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    gradient_state: GradientState | None = None,
    exact_resume: bool = False,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Rebuild ``dataloader`` so that this process yields its share of every epoch.

    Process ``i`` of ``n`` takes batches ``i, i+n, ...`` of the original loader (or slice ``i`` of each
    batch with ``split_batches``), so ``n`` processes with batch ``b`` see what one process sees with
    batch ``n*b``. ``dispatch_batches`` (default: on for iterable datasets) has rank 0 read everything and
    send each process its part. The user's loader settings (collate_fn, workers, pin_memory, generator, ...)
    are kept. Call it on every process: it may communicate.

    Shuffling is Accelerate's: the loader's own sampler is kept (its ``generator`` honoured); with several
    processes a sampler with a ``generator`` gets one if it has none (seeded from torch's global generator)
    and rank 0's generator state is given to every rank at each epoch start (``rng_types`` with
    ``"generator"``). ``use_seedable_sampler=True`` replaces a ``RandomSampler`` by a
    :class:`SeedableRandomSampler` seeded with ``data_seed`` (default: rank 0's torch seed, broadcast): the
    order is then a function of (seed, epoch), the same at any number of processes. ``exact_resume=True``
    (overdrive's; implies the seedable sampler) makes ``load_state`` put the loader back at its saved
    position. ``use_stateful_dataloader=True`` builds it on torchdata's ``StatefulDataLoader``, whose state
    dict ``load_state`` restores, as Accelerate (an error names the package when torchdata is missing).

        loader = prepare_data_loader(DataLoader(dataset, batch_size=16, shuffle=True),
                                     device=torch.device("cuda", 0), put_on_device=True)
    """
    if isinstance(dataloader, PreparedLoaderMixin):  # already prepared: sharding twice would lose data
        return cast("DataLoaderShard | DataLoaderDispatcher", dataloader)  # the mixin's only two classes
    num_processes, process_index = _processes(num_processes, process_index, torch_device_mesh)
    unbatched = dataloader.batch_sampler is None and dataloader.batch_size is None
    iterable = isinstance(dataloader.dataset, IterableDataset)
    if unbatched and num_processes == 1 and iterable:
        # samples as the dataset yields them, as Accelerate leaves them on one process
        return DataLoaderShard(dataloader.dataset, batch_size=None, device=device if put_on_device else None,
                               rng_types=rng_types, non_blocking=non_blocking, gradient_state=gradient_state,
                               **loader_settings(dataloader))
    _check_options(unbatched, exact_resume, use_stateful_dataloader)
    common: dict[str, Any] = dict(device=device if put_on_device else None, rng_types=rng_types,
                                  non_blocking=non_blocking, gradient_state=gradient_state,
                                  exact_resume=exact_resume, **loader_settings(dataloader))
    shard_class: Any = stateful_loader_class(DataLoaderShard) if use_stateful_dataloader else DataLoaderShard
    make_shard = functools.partial(shard_class, **common)
    make_dispatcher = None
    dispatch = iterable if dispatch_batches is None else bool(dispatch_batches)
    if dispatch:  # rank 0 reads and sends each process its part
        make_dispatcher = functools.partial(_dispatcher_class(use_stateful_dataloader), num_processes=num_processes,
                                            process_index=process_index, split_batches=split_batches,
                                            slice_fn=slice_fn_for_dispatch, **common)
    places = (num_processes, process_index, split_batches, even_batches)
    if iterable:
        return _iterable_loader(dataloader, places, make_shard, make_dispatcher)
    return _map_style_loader(dataloader, places, use_seedable_sampler or exact_resume, data_seed, make_shard,
                             make_dispatcher)


def _check_options(unbatched: bool, exact_resume: bool, use_stateful_dataloader: bool) -> None:
    if unbatched:
        raise ValueError("cannot prepare a DataLoader with batch_size=None and batch_sampler=None: the batches "
                         "to share out are unknown; give the DataLoader a batch_size or a batch_sampler")
    if exact_resume and use_stateful_dataloader:
        raise ValueError("exact_resume=True and use_stateful_dataloader=True: choose one way to resume the loader: "
                         "exact_resume (overdrive's own position, exact at any number of processes) or "
                         "use_stateful_dataloader (torchdata's state dict, as Accelerate)")


def _dispatcher_class(stateful: bool) -> Any:
    """``DataLoaderDispatcher``, on torchdata's ``StatefulDataLoader`` when ``stateful``."""
    # lazy: only a dispatching loader (rank 0 reads and sends) needs the dispatcher's module
    from overdrive.data.dispatch import DataLoaderDispatcher

    return stateful_loader_class(DataLoaderDispatcher) if stateful else DataLoaderDispatcher


#: (num_processes, process_index, split_batches, even_batches)
_Places = tuple[int, int, bool, bool]


def _iterable_loader(dataloader: DataLoader, places: _Places, make_shard: Callable[..., Any],
                     make_dispatcher: Callable[..., Any] | None) -> Any:
    """An iterable dataset's loader: dispatched from rank 0, read shard by shard by a ``datasets`` dataset
    that has enough shards, or each process keeping its share of the batches it reads."""
    num_processes, process_index, split_batches, even_batches = places
    dataset = cast(IterableDataset, dataloader.dataset)  # the caller checked it
    batch_size, drop_last = dataloader.batch_size, dataloader.drop_last
    assert batch_size is not None  # an iterable dataset's batch sampler exists only with a batch size
    if make_dispatcher is not None:
        stream = DispatchedIterable(dataset, batch_size, drop_last, num_processes, 0, split_batches, even_batches)
        return make_dispatcher(stream, batch_size=batch_size, drop_last=drop_last)
    native = _native_shard(dataset, num_processes, process_index, split_batches)
    if native is not None:  # a datasets.IterableDataset of enough shards: each process reads its own
        return make_shard(native, batch_size=batch_size, drop_last=drop_last)
    shard = IterableDatasetShard(dataset, batch_size, drop_last, num_processes, process_index, split_batches,
                                 even_batches)
    return make_shard(shard, batch_size=shard.per_process_batch_size, drop_last=drop_last)


def _map_style_loader(dataloader: DataLoader, places: _Places, seedable: bool, data_seed: int | None,
                      make_shard: Callable[..., Any], make_dispatcher: Callable[..., Any] | None) -> Any:
    """A map-style dataset's loader: its batch sampler shared out between the processes (or dispatched from
    rank 0), shuffled as Accelerate shuffles, or in an order of (seed, epoch) when ``seedable``."""
    num_processes, process_index, split_batches, even_batches = places
    # a DataLoader with a batch size builds a batch sampler; with neither it was refused before
    assert dataloader.batch_sampler is not None
    batch_sampler: Any = dataloader.batch_sampler
    if seedable:  # an order of (seed, epoch), which a resume can recompute
        batch_sampler = seedable_batch_sampler(batch_sampler, data_seed)
    if make_dispatcher is not None:
        # every process gets a part of every step: even_batches=False has no effect (as in Accelerate)
        rounds = BatchSamplerShard(batch_sampler, num_processes, 0, split_batches, even_batches=True)
        return make_dispatcher(dataloader.dataset, batch_sampler=DispatchBatchSampler(rounds))
    shard_sampler = BatchSamplerShard(batch_sampler, num_processes, process_index, split_batches, even_batches)
    generator = None if seedable else accelerate_shuffling(batch_sampler, num_processes)
    return make_shard(dataloader.dataset, batch_sampler=shard_sampler, synchronized_generator=generator)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader whose next iteration skips the first ``num_batches`` batches of the current epoch.

    A prepared loader is returned itself, skipping once (its later iterations are whole epochs). A plain
    DataLoader is rebuilt around the same sampler, skipping at every iteration (as in Accelerate). Map-style
    data is skipped by index, without loading the skipped samples; iterable data by reading it.

        loader = skip_first_batches(loader, num_batches=resume_step)
    """
    if num_batches < 0:
        raise ValueError(f"num_batches={num_batches} must be >= 0")
    if isinstance(dataloader, PreparedLoaderMixin):
        dataloader.skip_first(num_batches)
        return dataloader
    settings = loader_settings(dataloader)
    if isinstance(dataloader.dataset, IterableDataset) or dataloader.batch_sampler is None:
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              sampler=None if isinstance(dataloader.dataset, IterableDataset) else dataloader.sampler,
                              drop_last=dataloader.drop_last, **settings)
    return DataLoader(dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches),
                      **settings)
