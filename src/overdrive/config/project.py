"""Where a run writes (``ProjectConfiguration``) and how its data loaders behave (``DataLoaderConfiguration``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataLoaderConfiguration:
    """How prepared data loaders shard, order and move batches.

    - ``split_batches``: the loader's batch is the global batch and is split across processes
      (its size must divide by the number of processes); otherwise each process gets a whole batch.
    - ``dispatch_batches``: rank 0 reads every batch and sends each process its part (default: on for
      iterable datasets).
    - ``even_batches``: every process gets the same number of batches, wrapping around to the start of
      the data to fill the last one; ``gather_for_metrics`` drops those duplicates.
    - ``use_seedable_sampler``: shuffle from ``data_seed`` (default: the seed in force) and the epoch, so
      the global order is the same at any world size. Off (Accelerate's default): the loader's own sampler
      and ``generator`` are kept, with the generator synchronised across processes at each epoch.
    - ``non_blocking``: copy batches to the device asynchronously (with pinned memory).
    - ``use_stateful_dataloader``: build on torchdata's ``StatefulDataLoader``; ``state_dict()`` is
      torchdata's and ``load_state`` restores it (as Accelerate does).
    - ``exact_resume`` (overdrive's, off by default): ``load_state`` puts every prepared loader back where the
      checkpoint stopped, mid-epoch (also at another number of processes), and the resumed run's random
      numbers continue as if it had never stopped; implies ``use_seedable_sampler`` (and excludes
      ``use_stateful_dataloader``). Off, as in Accelerate,
      the script skips the batches it already trained on (``accelerator.skip_first_batches(loader, n)``).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    exact_resume: bool = False



@dataclass
class ProjectConfiguration:
    """Where a run writes its checkpoints and logs, and how checkpoints are named and kept."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    #: ``save_state()`` writes in the background by default (``save_state(async_save=...)`` decides per call)
    async_save: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it has none)."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        problems = self.problems()
        if problems:
            raise ValueError("ProjectConfiguration: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """What is wrong with the settings (also checked by ``save_state``, as they can be changed later)."""
        found = []
        limit = self.total_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            found.append(f"total_limit={limit!r} is not valid; give the number of checkpoints to keep (an integer "
                         "of at least 1), or None to keep them all")
        if isinstance(self.iteration, bool) or not isinstance(self.iteration, int) or self.iteration < 0:
            found.append(f"iteration={self.iteration!r} is not valid; it is the number of the next automatically "
                         "named checkpoint, an integer of at least 0")
        return found
