"""The tracker protocol, the registry of tracker names, and starting / finding trackers.

A tracker is a small object with ``name``, ``requires_logging_directory``, ``main_process_only`` and four
methods: ``start``, ``store_init_configuration``, ``log`` and ``finish``. The ``Accelerator`` calls those
methods on every process; a tracker whose ``main_process_only`` is True does nothing except on process 0
(``GeneralTracker`` makes that so for every subclass, custom ones included).
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from overdrive.config.choices import nearest

_GATED_METHODS = ("start", "store_init_configuration", "log", "finish")


def _process_index_from_group() -> int:
    # lazy: the launcher checks tracker names with this module before any worker starts, without torch
    from overdrive.runtime.group import rank

    return rank()


def on_main_process(method: Callable) -> Callable:
    """Make a tracker method a no-op on every process but 0 when the tracker's ``main_process_only`` is
    True. ``GeneralTracker`` applies it to ``start``, ``store_init_configuration``, ``log`` and ``finish``;
    decorate extra methods (``log_images``...) with it yourself."""
    if getattr(method, "_overdrive_gated", False):
        return method

    @functools.wraps(method)
    def gated(self: GeneralTracker, *args: Any, **kwargs: Any) -> Any:
        if not self.is_active:
            return None
        return method(self, *args, **kwargs)

    vars(gated)["_overdrive_gated"] = True  # a mark on the function object
    return gated


class GeneralTracker:
    """Base class of every tracker. Subclass it to log to your own backend::

        class PrintTracker(GeneralTracker):
            name = "print"
            requires_logging_directory = False

            def __init__(self, run_name: str):
                self.run_name = run_name

            def log(self, values, step=None, **kwargs):
                print(self.run_name, step, values)

        accelerator = Accelerator(log_with=[PrintTracker("my_run")])   # or register_tracker("print", PrintTracker)

    Put work that opens files or connections in ``start()``, not in ``__init__``: ``start`` runs only on the
    processes the tracker logs from. With ``main_process_only = True`` (the default) ``start``,
    ``store_init_configuration``, ``log`` and ``finish`` do nothing except on process 0.
    ``tracker`` returns the backend's own object (a W&B run, a ``SummaryWriter``...) for
    ``get_tracker(name, unwrap=True)``.
    """

    name: str = ""
    requires_logging_directory: bool = False
    # True: built with the logging directory (None when there is none) though it can do without one
    uses_logging_directory: bool = False
    main_process_only: bool = True
    # (module to import, package to pip install) pairs this tracker needs
    required_packages: tuple[tuple[str, str], ...] = ()
    # set by start_trackers on the instances it builds (declared here, not given class defaults)
    _overdrive_registry_name: str
    _overdrive_process_index: int | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method_name in _GATED_METHODS:
            method = cls.__dict__.get(method_name)
            if callable(method):
                setattr(cls, method_name, on_main_process(method))

    @property
    def is_active(self) -> bool:
        """True on the processes this tracker logs from (process 0, or all when not main-process-only)."""
        if not self.main_process_only:
            return True
        index = getattr(self, "_overdrive_process_index", None)
        return (_process_index_from_group() if index is None else index) == 0

    @property
    def tracker(self) -> Any:
        """The backend's own object; the tracker itself when it wraps nothing."""
        return self

    def start(self) -> None:
        """Open files, runs or connections. Called once by ``init_trackers``."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters (``init_trackers(config=...)``)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (name -> number, string or dict of numbers) at ``step``."""

    def finish(self) -> None:
        """Flush and close. Called by ``end_training``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class LibraryRunTracker(GeneralTracker):
    """A tracker around one run object of a tracking library (``self.run``, which ``start`` makes with
    ``init_kwargs``): ``log`` and ``finish`` call the run's own ``log`` and ``finish``, as most libraries name
    them (a subclass overrides what its library names otherwise)."""

    def __init__(self, run_name: str, **init_kwargs: Any) -> None:
        self.run_name = run_name
        self.init_kwargs = dict(init_kwargs)
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        return self.run

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


# -- registry -------------------------------------------------------------------------------------------

# built-in name -> "module:Class", imported when first used so that `import overdrive` stays light
_BUILTIN: dict[str, str] = {
    "jsonl": "overdrive.tracking.jsonl:JSONLTracker",
    "csv": "overdrive.tracking.csv:CSVTracker",
    "tensorboard": "overdrive.tracking.tensorboard:TensorBoardTracker",
    "mlflow": "overdrive.tracking.mlflow:MLflowTracker",
    "wandb": "overdrive.tracking.wandb:WandBTracker",
    "aim": "overdrive.tracking.aim:AimTracker",
    "comet_ml": "overdrive.tracking.library_runs:CometMLTracker",
    "clearml": "overdrive.tracking.library_runs:ClearMLTracker",
    "dvclive": "overdrive.tracking.library_runs:DVCLiveTracker",
    "trackio": "overdrive.tracking.library_runs:TrackioTracker",
    "swanlab": "overdrive.tracking.library_runs:SwanLabTracker",
}
_REGISTRY: dict[str, type[GeneralTracker] | str] = dict(_BUILTIN)
DEFAULT_TRACKER = "jsonl"


def register_tracker(name: str, cls: type[GeneralTracker]) -> None:
    """Make ``log_with=name`` start a ``cls``. ``cls`` is built as ``cls(project_name, logging_dir,
    **init_kwargs[name])`` when it requires (or uses) a logging directory, else
    ``cls(project_name, **init_kwargs[name])``.
    Registering a name again replaces the earlier class."""
    if not isinstance(name, str) or not name or name == "all":
        raise ValueError(f"register_tracker: the name must be a non-empty string other than 'all', got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, GeneralTracker)):
        raise TypeError(f"register_tracker({name!r}, ...): expected a subclass of "
                        f"overdrive.tracking.GeneralTracker, got {cls!r}")
    _REGISTRY[name] = cls


def unregister_tracker(name: str) -> None:
    """Forget the tracker registered as ``name`` (a ``KeyError`` when there is none)."""
    del _REGISTRY[name]


def tracker_names() -> list[str]:
    """Every name ``log_with`` accepts, besides ``"all"``."""
    return sorted(_REGISTRY)


def tracker_class(name: str) -> type[GeneralTracker]:
    """The class registered as ``name``; an error listing the valid names when there is none."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown tracker {name!r}; valid trackers: {tracker_names() + ['all']}"
                         f"{nearest(name, [*tracker_names(), 'all'])}. "
                         "Register your own with overdrive.tracking.register_tracker(name, cls) or pass "
                         "a GeneralTracker instance in log_with.")
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = entry
    return entry


def is_package_available(module: str) -> bool:
    """Whether ``module`` can be imported (False when ``sys.modules[module]`` is None, as tests set it)."""
    top = module.split(".")[0]
    if top in sys.modules and sys.modules[top] is None:
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(cls: type[GeneralTracker] | GeneralTracker) -> list[str]:
    """The pip names of the packages ``cls`` needs that are not installed."""
    return [pip for module, pip in getattr(cls, "required_packages", ()) if not is_package_available(module)]


def import_required(module: str, package: str, tracker: str) -> Any:
    """Import ``module`` for ``tracker``; an error saying what to ``pip install`` when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"the {tracker!r} tracker needs the {package!r} package, which is not installed: "
                          f"pip install {package}") from exc


def available_trackers() -> list[str]:
    """The registered trackers whose packages are installed (what ``log_with="all"`` starts)."""
    return [name for name in tracker_names() if not missing_packages(tracker_class(name))]


# -- starting and finding -------------------------------------------------------------------------------

def _entry_name(entry: Any) -> str | None:
    if isinstance(entry, enum.Enum):
        entry = entry.value
    return entry if isinstance(entry, str) else None


def _expand(log_with: Iterable[Any]) -> tuple[list[str | GeneralTracker], list[str]]:
    """Names and instances to start, in order and without repeats, and the problems found."""
    chosen: list[str | GeneralTracker] = []
    problems: list[str] = []
    for entry in log_with:
        name = _entry_name(entry)
        if isinstance(entry, GeneralTracker):
            chosen.append(entry)
        elif isinstance(entry, type) and issubclass(entry, GeneralTracker):
            problems.append(f"log_with got the class {entry.__name__}: pass an instance, or register it "
                            "with register_tracker(name, cls) and pass the name")
        elif name is None:
            problems.append(f"log_with entries must be tracker names or GeneralTracker instances, got {entry!r}")
        elif name.lower() == "all":
            chosen.extend(n for n in available_trackers() if n not in chosen)
        elif name not in _REGISTRY:
            problems.append(f"unknown tracker {name!r}; valid trackers: {tracker_names() + ['all']}"
                            f"{nearest(name, [*tracker_names(), 'all'])}")
        elif name not in chosen:
            chosen.append(name)
    return chosen, problems


def check_log_with(log_with: Iterable[Any]) -> list[str]:
    """Every problem with ``log_with`` (unknown names, missing packages), for reporting them at once."""
    chosen, problems = _expand(log_with)
    for entry in chosen:
        if isinstance(entry, str):
            for package in missing_packages(tracker_class(entry)):
                problems.append(f"the {entry!r} tracker needs the {package!r} package, which is not "
                                f"installed: pip install {package}")
    return problems


def trackers_needing_a_directory(log_with: Iterable[Any]) -> list[str]:
    """The names in ``log_with`` (``"all"`` expanded) whose tracker requires a logging directory."""
    chosen, _ = _expand(log_with)
    return [e for e in chosen if isinstance(e, str) and tracker_class(e).requires_logging_directory]


def start_trackers(log_with: Iterable[Any], project_name: str, *, config: dict | None = None,
                   init_kwargs: Mapping[str, dict] | None = None, logging_dir: str | None = None,
                   process_index: int = 0) -> list[GeneralTracker]:
    """Build and start the trackers named in ``log_with`` (names, ``LoggerType`` values, ``"all"`` or
    ``GeneralTracker`` instances; the JSONL tracker when empty) and store ``config`` in each.

    Call it on every process: problems are found identically everywhere, and trackers that log from the
    main process only do nothing elsewhere. ``init_kwargs[name]`` goes to that tracker's constructor.
    """
    init_kwargs = dict(init_kwargs or {})
    log_with = tuple(log_with or ())
    implicit = not log_with
    if implicit:
        if logging_dir is None:
            if process_index == 0:
                warnings.warn("init_trackers: no tracker was named in Accelerator(log_with=...) and no "
                              "project_dir was given, so nothing is logged. Pass project_dir to write "
                              "metrics.jsonl, or name trackers in log_with.", stacklevel=3)
            return []
        log_with = (DEFAULT_TRACKER,)
    problems = check_log_with(log_with)
    chosen, _ = _expand(log_with)
    trackers: list[GeneralTracker] = []
    for entry in chosen:
        if isinstance(entry, GeneralTracker):
            trackers.append(entry)
            continue
        cls = tracker_class(entry)
        if missing_packages(cls):
            continue  # already reported
        # subclasses define their own constructors: (project_name[, logging_dir], **init_kwargs)
        build = cast("Callable[..., GeneralTracker]", cls)
        kwargs = dict(init_kwargs.get(entry, {}))
        try:
            if cls.requires_logging_directory:
                if logging_dir is None:
                    problems.append(f"the {entry!r} tracker writes to a logging directory: pass "
                                    "Accelerator(project_dir=...) (or ProjectConfiguration(logging_dir=...))")
                    continue
                tracker = build(project_name, logging_dir, **kwargs)
            elif getattr(cls, "uses_logging_directory", False):
                tracker = build(project_name, logging_dir, **kwargs)
            else:
                tracker = build(project_name, **kwargs)
        except (TypeError, ValueError) as exc:
            problems.append(f"could not build the {entry!r} tracker with init_kwargs {kwargs}: {exc}")
            continue
        tracker._overdrive_registry_name = entry
        trackers.append(tracker)
    for tracker in trackers:
        if not isinstance(getattr(tracker, "name", None), str) or not tracker.name:
            problems.append(f"{tracker!r} has no name: set the class attribute `name`")
    if problems:
        raise ValueError("could not start the trackers:\n  - " + "\n  - ".join(problems))
    unused = sorted(set(init_kwargs) - {_name_of(t) for t in trackers} - {t.name for t in trackers})
    if unused and process_index == 0:
        warnings.warn(f"init_kwargs for {unused} were ignored: no running tracker has that name "
                      f"(running: {[t.name for t in trackers]})", stacklevel=3)
    for tracker in trackers:
        tracker._overdrive_process_index = process_index
        tracker.start()
        if config is not None:
            tracker.store_init_configuration(config)
    return trackers


def _name_of(tracker: GeneralTracker) -> str:
    return getattr(tracker, "_overdrive_registry_name", tracker.name)


class _Inactive:
    """What ``get_tracker(name, unwrap=True)`` gives on processes a tracker does not log from: every
    attribute and call is a silent no-op, so ``run.log_artifact(...)`` needs no rank check."""

    def __getattr__(self, name: str) -> _Inactive:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> _Inactive:
        return self

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<inactive tracker: this process does not log>"


def find_tracker(trackers: Iterable[GeneralTracker], name: str, unwrap: bool = False) -> Any:
    """The tracker called ``name`` among ``trackers`` (its backend's own object with ``unwrap=True``; on
    processes the tracker does not log from, a stand-in whose calls do nothing)."""
    wanted = _entry_name(name) or name
    trackers = list(trackers)
    for tracker in trackers:
        if wanted in (tracker.name, _name_of(tracker)):
            if not unwrap:
                return tracker
            return tracker.tracker if tracker.is_active else _Inactive()
    raise ValueError(f"no running tracker is called {wanted!r}; running trackers: "
                     f"{[t.name for t in trackers]}. Name it in Accelerator(log_with=...) and call "
                     "init_trackers() first.")


# -- value helpers shared by the built-in trackers --------------------------------------------------------

def to_python(value: Any) -> Any:
    """A tensor or numpy scalar as a Python number (a list when it has several elements)."""
    if hasattr(value, "detach") and hasattr(value, "tolist"):  # torch.Tensor
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy scalar
        return value.item()
    return value


def plain(value: Any) -> Any:
    """``value`` with tensors and numpy scalars replaced by Python numbers, at any depth."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return to_python(value)


def flatten(values: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """Nested dicts as one level, keys joined with ``sep``; tensors as Python numbers."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        full = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, full, sep))
        else:
            flat[full] = to_python(value)
    return flat


def is_number(value: Any) -> bool:
    """Whether ``value`` is a number a tracker can plot (not complex)."""
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


_warned_skips: set[tuple[str, str]] = set()


def warn_skipped(tracker: str, key: str, value: Any, accepted: str) -> None:
    """Warn (once per tracker and key) that a value the backend cannot record was left out."""
    if (tracker, key) in _warned_skips:
        return
    _warned_skips.add((tracker, key))
    warnings.warn(f"the {tracker!r} tracker left out {key!r}: it records {accepted}, not "
                  f"{type(value).__name__}", stacklevel=4)
