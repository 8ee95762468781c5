"""The ``Accelerator``'s collectives over nested structures: ``gather``, ``gather_for_metrics``, ``reduce``,
``pad_across_processes``, the trigger flag and ``join_uneven_inputs``.

``Accelerator`` inherits them; they run ``overdrive.helpers.ops`` over the mesh's data-parallel share and read the
end of the data from the gradient state. ``reports_hangs`` marks the verbs whose collective's timeout is reported
before the error leaves overdrive (on a group made outside overdrive, as Ray Train's).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.distributed.algorithms.join import Join

import overdrive.helpers.ops as ops
from overdrive.runtime import group

if TYPE_CHECKING:
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.strategies.base import StrategyBase
    from overdrive.training.prepared import PreparedObjects
    from overdrive.training.state import AcceleratorState, GradientState

_Verb = TypeVar("_Verb", bound=Callable[..., Any])


def report_hang(error: BaseException) -> None:
    """The hang report of a collective that timed out or lost a rank, made now where the process group was
    adopted (``overdrive.runtime.watchdog.report_before_raise``); nothing otherwise."""
    # lazy: loaded only once a collective failed; a one-process run never loads the watchdog
    from overdrive.runtime import watchdog

    watchdog.report_before_raise(error)


def reports_hangs(verb: _Verb) -> _Verb:
    """``verb``, whose collective's timeout (or lost rank) is reported before the error leaves overdrive."""

    @functools.wraps(verb)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return verb(*args, **kwargs)
        except Exception as error:
            report_hang(error)
            raise

    return run  # pyright: ignore[reportReturnType]


class CollectiveVerbs:
    """Accelerate's collective verbs on an object with ``state``, ``mesh``, ``gradient_state``, ``prepared`` and
    ``strategy``."""

    state: AcceleratorState
    mesh: ParallelMesh
    strategy: StrategyBase
    gradient_state: GradientState
    prepared: PreparedObjects
    #: raised by ``set_trigger`` on this process, read (and lowered) by ``check_trigger``
    flag_tensor: torch.Tensor | None

    @reports_hangs
    def gather(self, tensor: Any) -> Any:
        """Every process's tensors (nested structures too), concatenated along dim 0 in rank order.

        Tensor-parallel peers hold the same outputs: one of each group contributes."""
        return ops.gather(_own_share(self.mesh, tensor))

    @reports_hangs
    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, minus the samples repeated to fill the last batch: over an epoch the results are
        exactly the dataset's samples, in order, at any world size."""
        input_data = _own_share(self.mesh, input_data)
        all_tensors = _all_tensors(input_data)
        if use_gather_object or not all_tensors:
            data = ops.gather_object(input_data)
        else:
            data = ops.gather(input_data)
        state = self.gradient_state
        loader = state.active_dataloader
        if loader is not None and not getattr(loader, "even_batches", True):
            # Uneven batches repeat no sample: nothing to trim. A process with fewer batches joins the longer
            # ones' remaining gathers once its loop ends (the loader replays this call with no data).
            loader.note_final_gather(input_data, all_tensors and not use_gather_object)
            return data
        if state.end_of_dataloader and state.remainder == -1 and loader is not None:
            _warn_padded_stream(loader)
        if not (state.end_of_dataloader and state.remainder > 0):
            return data
        total = getattr(loader, "total_batch_size", None)
        remainder = self.strategy.gathered_remainder(state.remainder, total) if total else state.remainder
        if all_tensors and not use_gather_object:
            return ops.recursively_apply(lambda t: t[:remainder], data)
        return data[:remainder]

    @reports_hangs
    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """``tensor`` (nested structures too) reduced over every process: ``"sum"``, ``"mean"``, ``"max"``
        or ``"none"``, multiplied by ``scale``."""
        return ops.reduce(tensor, reduction, scale)

    @reports_hangs
    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """``tensor`` padded with ``pad_index`` along ``dim`` to the longest size on any process, so that it
        can be gathered."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` will see on every process."""
        self.flag_tensor = torch.tensor(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (a collective: call on all)."""
        flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.state.device)
        if self.reduce(flag, reduction="sum").item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
            return True
        return False

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Train on data whose per-process length differs: processes that run out shadow the others'
        collectives (``torch.distributed.algorithms.Join``)."""
        if self.state.num_processes == 1:
            yield
            return
        loaders = self.prepared.dataloaders
        saved = [loader.even_batches for loader in loaders]
        if even_batches is not None:
            for loader in loaders:
                loader.even_batches = even_batches
        try:
            with Join(joinables):
                yield
        finally:
            for loader, value in zip(loaders, saved):
                loader.even_batches = value


def _all_tensors(data: Any) -> bool:
    leaves: list[Any] = []
    ops.recursively_apply(leaves.append, data, test_type=lambda x: True)
    return bool(leaves) and all(isinstance(leaf, torch.Tensor) for leaf in leaves)


_warned_padded_stream: list[bool] = []


def _warn_padded_stream(loader: Any) -> None:
    """Once per run, on the main process: data of unknown length, with its last batch padded (several
    processes, ``drop_last=False``), gives ``gather_for_metrics`` no count of the repeated samples, so they stay
    in its result, as in Accelerate."""
    if _warned_padded_stream or getattr(loader, "_drop_last", True) or group.world_size() <= 1:
        return
    _warned_padded_stream.append(True)
    if group.rank() == 0:
        warnings.warn("gather_for_metrics: the data has no length, so the samples repeated to fill the last "
                      "batch of each process (if any) cannot be dropped and stay in the result, as in Accelerate; "
                      "drop them yourself, give the dataset a __len__, or use dispatch_batches=True", stacklevel=3)


def _own_share(mesh: ParallelMesh, data: Any) -> Any:
    """``data`` on processes that own their group's output (``mesh.owns_output()``); on their peers, empty
    slices of its tensors (or an empty list for other objects, which ``gather_object`` then skips)."""
    if mesh.owns_output():
        return data
    if not _all_tensors(data):
        return []
    return ops.recursively_apply(lambda t: (t.reshape(1) if t.ndim == 0 else t)[:0], data)
