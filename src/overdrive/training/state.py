"""Process and training state with Accelerate's names: PartialState, AcceleratorState, GradientState.

A process has one place in the job and one default process group, so ``PartialState`` shares its
state across instances (every ``PartialState()`` answers the same). Everything here is read from the
resolved plan; nothing reads the environment itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from overdrive.config import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs
from overdrive.resolve.process import resolve_process
from overdrive.training.accumulation import AccumulationWindow

if TYPE_CHECKING:
    from overdrive.resolve.plan import TrainingPlan
    from overdrive.resolve.process import ProcessPlan

logger = logging.getLogger("accelerate.state")


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything and return None (Accelerate's placeholder callable)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A descriptor holding one dict shared by every instance of a class within a thread (Accelerate's state
    storage for multi-threaded XLA runs): ``obj.attr`` and ``cls.attr`` give the same dict, ``obj.attr = d``
    replaces it."""

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


#: the type of the states' shared storage: a plain dict (overdrive does not run XLA's threads)
SharedDict = dict


class PartialState:
    """Which process this is, on which device, and the process-control helpers.

    Use it in scripts that need process information without an ``Accelerator``::

        state = PartialState()
        with state.main_process_first():
            dataset = build_or_load_cache()
    """

    _shared: dict[str, Any] = {}
    #: Accelerate's name for the shared state: empty until the process state is created (transformers'
    #: DETR-family losses test ``PartialState._shared_state != {}`` before reducing across processes)
    _shared_state = _shared

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared
        if "plan" not in self.__dict__:
            init_kwargs = kwargs.pop("init_kwargs", None) or InitProcessGroupKwargs(**kwargs)
            self.plan: ProcessPlan = resolve_process(cpu=cpu, init_kwargs=init_kwargs)
            self.plan.start()
        elif cpu and self.plan.device.type != "cpu":
            raise RuntimeError(
                f"the process state was already created on {self.plan.device}; PartialState(cpu=True) must "
                "come before the first Accelerator() or PartialState() in the process"
            )

    def __getattr__(self, name: str) -> Any:
        # reached only when the normal lookup failed: a state attribute read after _reset_state() (the shared
        # state is gone) is told apart from a name the state never had
        kind = type(self).__name__
        if "plan" not in self.__dict__ and not name.startswith("__") and hasattr(type(self), name):
            raise AttributeError(f"`{kind}` object has no attribute `{name}`: the process state was cleared. This "
                                 f"happens if `{kind}._reset_state()` was called and no `Accelerator` or "
                                 f"`{kind}` was built again since; build one before reading `{name}`")
        raise AttributeError(f"'{kind}' object has no attribute '{name}'")

    @classmethod
    def _reset_state(cls, destroy_process_group: bool = False) -> None:
        if destroy_process_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        cls._shared.clear()

    @property
    def initialized(self) -> bool:
        """Whether this process's place (rank, device, process group) has been resolved."""
        return "plan" in self.__dict__

    # -- where and who ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device this process computes on (``cuda:<local rank>``, ``mps``, ``cpu``, ...)."""
        return self.plan.device

    @property
    def default_device(self) -> torch.device:
        """The same as :attr:`device` (Accelerate's name)."""
        return self.plan.device

    @property
    def backend(self) -> str | None:
        """The process group's backend ("nccl", "gloo", ...), or ``None`` in a single process."""
        return self.plan.backend

    @property
    def num_processes(self) -> int:
        """The number of processes taking part (the world size)."""
        return self.plan.info.world_size

    @property
    def process_index(self) -> int:
        """This process's global rank, from 0."""
        return self.plan.info.rank

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine, from 0."""
        return self.plan.info.local_rank

    @property
    def num_machines(self) -> int:
        """The number of machines: world size over processes per machine (at least 1)."""
        return max(1, self.plan.info.world_size // max(1, self.plan.info.local_world_size))

    @property
    def is_main_process(self) -> bool:
        """Whether this is the process of global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the first process of its machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process of the highest rank."""
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.num_processes > 1

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's ``DistributedType`` for this run (a description; overdrive never branches on it)."""
        return self.plan.distributed_type

    @property
    def debug(self) -> bool:
        """Whether distributed debug checks are on (``--debug`` or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``);
        settable, as in Accelerate (its test scripts switch it on for operation checks)."""
        return self.__dict__.get("_debug_override", self.plan.debug)

    @debug.setter
    def debug(self, value: bool) -> None:
        self.__dict__["_debug_override"] = bool(value)

    # -- process control ----------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        if self.use_distributed:
            dist.barrier()

    @contextlib.contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on the others (e.g. to build a cache once)."""
        return self._goes_first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """As ``main_process_first``, once per machine."""
        return self._goes_first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of a list, tuple, dict of sequences or tensor.

        With ``apply_padding`` every share has the same length, padded with the last element, so the
        results can be gathered.
        """
        if self.num_processes == 1:
            yield inputs
            return
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    def _run_if(self, condition: Callable[[PartialState], bool], function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition(self):
                return function(*args, **kwargs)
            return None

        return wrapper

    def on_main_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on the main process only."""
        return self._run_if(lambda s: s.is_main_process, function)

    def on_local_main_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on each machine's main process only."""
        return self._run_if(lambda s: s.is_local_main_process, function)

    def on_last_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on the last process only."""
        return self._run_if(lambda s: s.is_last_process, function)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        """Decorator: run ``function`` on process ``process_index`` only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._run_if(lambda s: s.process_index == process_index, function)

    def on_local_process(self, function: Callable | None = None,
                         local_process_index: int | None = None) -> Callable:
        """Decorator: run ``function`` only on the process of local rank ``local_process_index``."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._run_if(lambda s: s.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy ``group`` (default: the default process group), if a process group is initialized."""
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        kind = self.distributed_type  # written as Accelerate's enum prints itself: DistributedType.MULTI_CPU
        return (f"Distributed environment: {type(kind).__name__}.{kind.value}{backend}\nNum processes: {self.num_processes}\n"
                f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
                f"Device: {self.device}\n")


def _split(inputs: Any, parts: int, index: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(f"split_between_processes needs values of one length, got lengths {sorted(lengths)}")
        return {k: _split(v, parts, index, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    per, extra = divmod(length, parts)
    start = index * per + min(index, extra)
    end = start + per + (1 if index < extra else 0)
    if hasattr(inputs, "select") and hasattr(inputs, "column_names"):  # a datasets.Dataset: slicing gives a dict
        rows = list(range(start, end))
        if apply_padding:
            rows += [length - 1] * (math.ceil(length / parts) - len(rows))
        return inputs.select(rows)
    share = inputs[start:end]
    if apply_padding:
        target = math.ceil(length / parts)
        missing = target - (end - start)
        if missing > 0:
            if isinstance(share, torch.Tensor):
                share = torch.cat([share, inputs[-1:].expand(missing, *inputs.shape[1:])])
            else:
                share = list(share) + [inputs[-1]] * missing
                share = type(inputs)(share) if isinstance(inputs, tuple) else share
    return share


class PluginSelection:
    """Which of a run's named plugins (DeepSpeed's) the next ``prepare()`` uses: the first until
    ``AcceleratorState.select_deepspeed_plugin`` chooses another. Runtime state, so the plan stays frozen."""

    def __init__(self, plugins: Mapping[str, Any]) -> None:
        self.plugins = plugins
        self.name: str = next(iter(plugins))

    @property
    def plugin(self) -> Any:
        """The selected plugin."""
        return self.plugins[self.name]


class AcceleratorState(PartialState):
    """The process state plus the training settings of an ``Accelerator``.

    As in Accelerate, ``AcceleratorState._shared_state`` is one dict beside ``PartialState``'s: the process
    state plus the newest Accelerator's settings, ``{}`` until an Accelerator exists, and ``AcceleratorState()``
    built elsewhere (by another library) reads it. ``accelerator.state`` answers for that Accelerator's own plan,
    even after another ``Accelerator()`` with other settings is built in the process (Accelerate refuses the
    second one). ``AcceleratorState._reset_state()`` clears them all: every ``accelerator.state`` then reads as
    reset, and reading a state attribute says so.
    """

    #: Accelerate's shared dict (transformers reads it); the newest Accelerator's state, else empty
    _shared_state: dict[str, Any] = {}
    #: every Accelerator's state (each an own dict), so that _reset_state() reaches them all
    _views: weakref.WeakSet[AcceleratorState] = weakref.WeakSet()
    #: the states _reset_state() cleared: the next Accelerator's settings become theirs (in Accelerate every
    #: state is the one shared dict, so a new Accelerator brings the old ones back)
    _cleared: weakref.WeakSet[AcceleratorState] = weakref.WeakSet()

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        PartialState(cpu=cpu, init_kwargs=kwargs.get("init_kwargs"))  # the process state, made once
        self.__dict__ = AcceleratorState._shared_state
        self.__dict__.update(PartialState._shared)  # the process state as it is now (Accelerate's refresh)

    def adopt(self, training: TrainingPlan) -> None:
        """Answer for ``training`` (an Accelerator's plan) from now on; make it the process's newest."""
        view = dict(PartialState._shared, training=training)
        settings = training.deepspeed
        view["deepspeed_selection"] = PluginSelection(settings.plugins) if settings is not None else None
        AcceleratorState._shared_state.clear()
        AcceleratorState._shared_state.update(view)
        # an own dict: a later Accelerator replaces the shared settings, not this one's
        for state in (self, *AcceleratorState._cleared):
            state.__dict__ = view
            AcceleratorState._views.add(state)
        AcceleratorState._cleared.clear()

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator's settings are set (Accelerate: the state differs from the process state)."""
        return "training" in self.__dict__

    @property
    def _training(self) -> TrainingPlan | None:
        """The plan this state answers for, or None before an Accelerator exists."""
        return self.__dict__.get("training")

    @property
    def mixed_precision(self) -> str:
        """The resolved mixed precision ("no", "fp16", "bf16" or "fp8"); "no" before an Accelerator exists."""
        training = self._training
        return training.precision.name if training is not None else "no"

    @property
    def num_steps(self) -> int:
        """Micro-batches per optimizer step (the accumulation window); 1 before an Accelerator exists."""
        training = self._training
        steps = training.accumulation.num_steps if training is not None else None
        return steps if steps is not None else 1  # (the resolver fills num_steps in the plan's copy)

    @property
    def deepspeed_plugins(self) -> dict[str, Any] | None:
        """The DeepSpeed plugins by name (one plugin given alone is ``"default"``), or None. They are the
        plan's copies of the plugins given: the user's objects are never changed."""
        training = self._training
        settings = training.deepspeed if training is not None else None
        return dict(settings.plugins) if settings is not None else None

    @property
    def deepspeed_selection(self) -> PluginSelection | None:
        """Which DeepSpeed plugin the next ``prepare()`` uses (runtime state, beside the frozen plan)."""
        return self.__dict__.get("deepspeed_selection")

    @property
    def deepspeed_plugin(self) -> Any:
        """The selected DeepSpeed plugin: the one the next ``prepare()`` builds an engine with."""
        selection = self.deepspeed_selection
        return selection.plugin if selection is not None else None

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin called ``name``; a ``ValueError`` lists the valid names if there is none."""
        return self._deepspeed_plugins_or_error(name)[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Use the plugin called ``name`` for the models prepared from now on (``None``: the first)::

            accelerator = Accelerator(deepspeed_plugins={"student": zero2, "teacher": zero3})
            student, optimizer, loader = accelerator.prepare(student, optimizer, loader)
            accelerator.state.select_deepspeed_plugin("teacher")
            teacher = accelerator.prepare(teacher)
        """
        plugins = self._deepspeed_plugins_or_error(name)
        selection = self.deepspeed_selection
        assert selection is not None  # a run with plugins has a selection (adopt)
        selection.name = next(iter(plugins)) if name is None else name

    def _deepspeed_plugins_or_error(self, name: str | None) -> dict[str, Any]:
        plugins = self.deepspeed_plugins
        if not plugins:
            raise ValueError("this run has no DeepSpeed plugins; give Accelerator(deepspeed_plugins={name: "
                             "DeepSpeedPlugin(...)}) or launch with --use_deepspeed")
        if name is not None and name not in plugins:
            raise ValueError(f"no DeepSpeed plugin is called {name!r}; the plugins are {sorted(plugins)}")
        return plugins

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP plugin of the running Accelerator when it shards with FSDP, else None (transformers
        decides from this whether FSDP is on)."""
        training = self._training
        return training.fsdp if training is not None else None

    @classmethod
    # Accelerate's signature, which differs from PartialState's: its callers pass reset_partial_state first
    def _reset_state(cls, reset_partial_state: bool = False,  # pyright: ignore[reportIncompatibleMethodOverride]
                     destroy_process_group: bool = False) -> None:
        """Forget the training settings of every Accelerator (Accelerate's signature); with
        ``reset_partial_state`` the process state too (the process group stays unless
        ``destroy_process_group``; it is joined again if needed)."""
        AcceleratorState._shared_state.clear()
        for state in list(AcceleratorState._views):
            state.__dict__.clear()
            AcceleratorState._cleared.add(state)
        AcceleratorState._views.clear()
        if reset_partial_state:
            PartialState._reset_state(destroy_process_group=destroy_process_group)

    def __repr__(self) -> str:
        text = super().__repr__() + f"\nMixed precision type: {self.mixed_precision}\n"
        if self.distributed_type == DistributedType.DEEPSPEED and self.deepspeed_plugin is not None:
            text += f"ds_config: {self.deepspeed_plugin.deepspeed_config}\n"
        return text


class _DataProgress:
    """Where the active prepared data loader stands (one per process: loaders report here)."""

    __slots__ = ("active_dataloader", "dataloader_references", "end_of_dataloader", "remainder")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.active_dataloader: Any = None
        self.dataloader_references: list[Any] = [None]
        self.end_of_dataloader = False
        self.remainder = -1


def _progress_field(name: str) -> property:
    def get(self: GradientState) -> Any:
        return getattr(GradientState._progress, name)

    def set_(self: GradientState, value: Any) -> None:
        setattr(GradientState._progress, name, value)

    return property(get, set_, doc=f"The process's data-loader ``{name}``.")


def _window_field(name: str, doc: str) -> property:
    def get(self: GradientState) -> Any:
        return getattr(self.window, name)

    def set_(self: GradientState, value: Any) -> None:
        setattr(self.window, name, value)

    return property(get, set_, doc=doc)


class GradientState:
    """Whether gradients are synchronised this step, and where the active data loader stands.

    The accumulation settings and the sync flag are read from an :class:`AccumulationWindow` (the
    Accelerator's own; ``GradientState()`` built elsewhere gets the newest Accelerator's). Where the data
    loaders stand is shared by every instance in the process (as in Accelerate): prepared loaders report
    the end of their data here, and ``accumulate`` and ``gather_for_metrics`` read it.
    """

    _progress = _DataProgress()
    #: the window of the newest Accelerator (or of the first ``GradientState()``), for instances built without one
    _shared: dict[str, Any] = {}
    #: Accelerate's name for it
    _shared_state = _shared

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 window: AccumulationWindow | None = None) -> None:
        if window is None:
            window = self._shared.get("window")
            if window is None:
                window = self._shared["window"] = AccumulationWindow()
        self.window = window
        if gradient_accumulation_plugin is not None:
            window.configure(gradient_accumulation_plugin)

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared.clear()
        cls._progress.reset()

    @classmethod
    def _make_current(cls, window: AccumulationWindow) -> None:
        """``GradientState()`` built from now on (by other libraries) reads ``window``."""
        cls._shared["window"] = window

    sync_gradients = _window_field("sync", "Whether gradients synchronise (and optimizers step) this micro-batch.")
    num_steps = _window_field("num_steps", "The accumulation window length.")
    adjust_scheduler = _window_field("adjust_scheduler", "Whether schedulers count skipped steps.")
    sync_with_dataloader = _window_field("sync_with_dataloader", "Whether a window ends with the data.")
    sync_each_batch = _window_field("sync_each_batch", "Whether gradients synchronise on every micro-batch.")
    active_dataloader = _progress_field("active_dataloader")
    dataloader_references = _progress_field("dataloader_references")
    end_of_dataloader = _progress_field("end_of_dataloader")
    remainder = _progress_field("remainder")

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings as ``GradientAccumulationPlugin`` keywords (transformers reads them)."""
        return {"num_steps": self.num_steps, "adjust_scheduler": self.adjust_scheduler,
                "sync_with_dataloader": self.sync_with_dataloader, "sync_each_batch": self.sync_each_batch}

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared data loader is being iterated (Accelerate's name)."""
        return self._progress.active_dataloader is not None

    @property
    def initialized(self) -> bool:
        """Always ``True``: this state needs no set-up step (Accelerate's name)."""
        return True

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.window.sync = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        """Called by a prepared loader when its iteration starts: it becomes the active one."""
        progress = self._progress
        progress.active_dataloader = dataloader
        progress.dataloader_references.append(dataloader)
        progress.end_of_dataloader = False
        progress.remainder = -1

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Called when its iteration ends: the loader that was active before it becomes active again."""
        progress = self._progress
        if dataloader in progress.dataloader_references:
            progress.dataloader_references.remove(dataloader)
        previous = progress.active_dataloader = progress.dataloader_references[-1]
        # "is not None": truth-testing a loader calls len(), which a stream of unknown length refuses
        progress.end_of_dataloader = bool(getattr(previous, "end_of_dataloader", False)) if previous is not None else False
        progress.remainder = getattr(previous, "remainder", -1) if previous is not None else -1


def is_initialized() -> bool:
    """Whether an ``Accelerator`` (or ``AcceleratorState``) has set up the training state in this process."""
    return AcceleratorState._shared_state != {}
