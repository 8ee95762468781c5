"""Fault-tolerant data parallel through torchft (``--ft_lighthouse``).

Each launch (each machine) is one replica group: its processes train data parallel between them, and the
groups average their gradients through torchft's ``Manager``, which asks the lighthouse at the start of every
step which groups take part (the quorum). A group that is lost drops out: the step it was lost in is not
committed (its batch is dropped, the optimizer and the scheduler do not step) and the others go on at once,
with no restart and no checkpoint. A group launched again joins the next quorum and heals: a live group
sends it the weights, the optimizer and scheduler states and the data position over torchft's checkpoint
transport (nothing is read from disk), and from that step on all groups train together again.

torchft's own pieces do the work: its ``Manager``, its reconfigurable process group and its
``OptimizerWrapper``, with DDP set up as torchft's ``DistributedDataParallel`` sets it up. overdrive
chooses when a quorum is asked for (at the first training forward of a step, or as the first data loader
starts, so a group that heals before its first batch continues at the live groups' data position), shards
the data over all groups, and reports (``ft_reports.py``). :class:`FaultTolerance` holds all of that for
any data parallel inside a group: DDP here (``ft_ddp``), FSDP2 in ``fault_tolerant_fsdp2.py`` (``ft_fsdp2``).
"""

from __future__ import annotations

import atexit
import ctypes
import platform
import socket
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupDummy, ProcessGroupGloo, ProcessGroupNCCL

from overdrive.resolve import DDPSettings, FaultTolerantSettings
from overdrive.runtime.group import rank, world_size
from overdrive.strategies.base import StrategyBase, StrategyContext
from overdrive.strategies.ddp import DDPStrategy
from overdrive.strategies.ft_reports import QuorumReports, ReportingClient, UnevenReplicaGroups, replica_name
from overdrive.strategies.single import SingleDeviceStrategy
from overdrive.training.prepared import PreparedObjects


class LighthouseLost(RuntimeError):
    """No quorum could be formed: the lighthouse cannot be reached (or answered nothing in time)."""


class FaultTolerance(StrategyBase):
    """torchft's replica groups around the data parallel inside a group: the manager, the step's quorum, the
    commit, the data split over every group, and the state a healing group receives (see the module
    docstring). A strategy mixes it in before the strategy it runs inside each group (``ft_ddp``: DDP,
    ``ft_fsdp2``: FSDP2), whose settings it hands over as :meth:`group_settings`; its ``wrap_model`` calls
    :meth:`watch_steps` on the model it trains."""

    settings_type = FaultTolerantSettings

    def __init__(self, context: StrategyContext, settings: FaultTolerantSettings) -> None:
        super().__init__(context, self.group_settings(settings))
        self.ft = settings
        self.prepared: PreparedObjects | None = None
        #: a quorum was taken for the step in progress (closed when the optimizer steps)
        self.open = False
        #: the quorum of the step in progress was asked for by a forward, after its batch was drawn
        self.from_forward = False
        #: the quorum was asked for as a loader began: loader positions are taken from a healing state
        self.at_loader_start = False
        #: when the step's quorum was asked for (a heal applied at the commit is timed from it)
        self.quorum_started = 0.0
        #: the groups taking part in the step in progress, and whether this one does (known once its quorum is)
        self.participants: int | None = None
        self.participating = False
        self.reports = QuorumReports(settings, rank() == 0, world_size())
        if self.device.type == "cpu":
            _keep_freed_memory()
        self.manager = self._start_manager()

    @staticmethod
    def group_settings(settings: FaultTolerantSettings) -> Any:
        """The settings of the strategy that runs inside the group."""
        raise NotImplementedError

    # -- torchft's manager ---------------------------------------------------------------------------
    def _start_manager(self) -> Manager:
        timeout = timedelta(seconds=self.ft.timeout_s)
        group = ProcessGroupGloo(timeout=timeout) if self.device.type == "cpu" else ProcessGroupNCCL(timeout=timeout)
        store = self.ft.store
        if store is None:  # one process not started by torchrun: the group's store is this process's own
            self._own_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            store = (socket.gethostname(), self._own_store.port)  # (it listens on every interface)
        host = socket.gethostname()
        try:
            manager = Manager(
                pg=group, load_state_dict=self._load_state, state_dict=self._state, min_replica_size=1,
                use_async_quorum=True, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
                rank=rank(), world_size=world_size(), store_addr=store[0], store_port=store[1],
                lighthouse_addr=self.ft.lighthouse, hostname=host,
                replica_id=replica_name(host, world_size(), self.ft.replica_group))
        except Exception as exc:
            raise LighthouseLost(self._lost_message(exc)) from exc
        # the quorum's members are read from torchft's client, which the manager keeps no record of
        client = ReportingClient(manager._client, self.reports.on_quorum, alone=world_size() == 1)
        manager._client = client  # pyright: ignore[reportAttributeAccessIssue]
        atexit.register(manager.shutdown, wait=False)
        return manager

    def _lost_message(self, exc: BaseException) -> str:
        return (f"overdrive: fault-tolerant training could not reach a quorum through the lighthouse at "
                f"{self.ft.lighthouse} within {self.ft.timeout_s:g} s ({type(exc).__name__}: {exc}); check that "
                "'overdrive lighthouse' runs there and answers from this machine, then launch this replica group "
                "again (--timeout sets how long to wait)")

    def start_quorum(self, from_forward: bool) -> None:
        """Ask the lighthouse which groups take part in this step.

        From a forward, the quorum runs beside it (torchft's asynchronous quorum, waited for when the forward
        ends): a group that is behind heals when the step commits. As a loader begins, it is waited for at
        once and a heal is applied at once, so that the group receives the data position before it draws its
        first batch. Either way the healing group adds nothing to that step's average and the others divide
        by their own number (torchft's asynchronous rule, which every group must follow alike), and it steps
        with their average from the state they had before the step."""
        self.quorum_started = time.perf_counter()
        self.from_forward, self.at_loader_start = from_forward, not from_forward
        try:
            self.manager.start_quorum()
            if not from_forward:
                self.wait_quorum()
                manager: Any = self.manager
                if manager._healing:  # the received state now, not at the commit (as torchft's own sync mode)
                    manager._apply_pending_state_dict()
                    manager._healing = False
                    self.participating = manager.is_participating()
        except (LighthouseLost, UnevenReplicaGroups):
            raise
        except Exception as exc:
            raise LighthouseLost(self._lost_message(exc)) from exc
        finally:
            self.at_loader_start = False
        self.open = True
        if not from_forward:
            self.reports.after_quorum(time.perf_counter() - self.quorum_started)

    def wait_quorum(self) -> None:
        """The step's quorum is formed (a lighthouse that cannot be reached ends the group here); the groups
        taking part in it are kept for the step's averages."""
        try:
            self.manager.wait_quorum()
        except UnevenReplicaGroups:
            raise
        except Exception as exc:
            raise LighthouseLost(self._lost_message(exc)) from exc
        self.participants, self.participating = self.manager.num_participants(), self.manager.is_participating()

    def step_ended(self, committed: bool) -> None:
        """The optimizer stepped (``committed``) or dropped the step: the next forward asks for a new quorum."""
        self.open, self.participants = False, None
        if self.reports.received_bytes is not None:  # a heal applied at this commit
            self.reports.after_quorum(time.perf_counter() - self.quorum_started)
        if not committed:
            self.reports.dropped(self.manager.current_step())

    # -- the strategy ---------------------------------------------------------------------------------
    def track_prepared(self, prepared: PreparedObjects) -> None:
        """Keep the registry: a healing group receives (and a live one sends) what it holds."""
        self.prepared = prepared

    def data_place(self, num_processes: int, process_index: int) -> tuple[int, int]:
        """Every group reads its own shards: the data is split over all groups' processes."""
        return num_processes * self.ft.num_replica_groups, self.ft.replica_group * num_processes + process_index

    def gathered_remainder(self, remainder: int, total_batch_size: int) -> int:
        """A gather reaches this group's processes only: the real samples of the last batch that are theirs (the
        shards are in group order, the real samples first)."""
        share = total_batch_size // self.ft.num_replica_groups
        return min(max(remainder - self.ft.replica_group * share, 0), share)

    def loader_hook(self) -> Callable[[Any], None] | None:
        """The first loader to begin takes the first quorum, so that a healing group starts where the others are."""
        return self._before_epoch

    def _before_epoch(self, loader: Any) -> None:
        if not self.reports.quorums:
            self.start_quorum(from_forward=False)

    def watch_steps(self, model: nn.Module) -> None:
        """Take each step's quorum before ``model``'s first training forward of the step, and wait for it when
        that forward ends."""
        model.register_forward_pre_hook(self._before_forward)
        model.register_forward_hook(self._after_forward)

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if not self.open and module.training and torch.is_grad_enabled():
            self.start_quorum(from_forward=True)

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.open and module.training and torch.is_grad_enabled():
            self.wait_quorum()

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """torchft's optimizer wrapper: the optimizer steps only when every process of the group may commit."""
        if any(isinstance(opt.optimizer, CommittingOptimizer) for opt in (self.prepared.optimizers if self.prepared
                                                                          else [])):
            raise ValueError("fault-tolerant training (--ft_lighthouse) takes one optimizer: each step commits "
                             "once; combine the parameter groups into one optimizer")
        return CommittingOptimizer(self.manager, super().prepare_optimizer(optimizer, models), self.step_ended)

    # -- what a healing group receives --------------------------------------------------------------
    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """What a healing group receives of a prepared ``model``: its state dict (read on torchft's quorum
        thread, while this process may be inside the step's forward)."""
        return self.unwrap_model(model).state_dict()

    def _state(self) -> dict[str, Any]:
        prepared = self.prepared
        assert prepared is not None
        state = {"models": [self.model_state(m) for m in prepared.models],
                 "optimizers": [opt.state_dict() for opt in prepared.optimizers],
                 "schedulers": [s.state_dict() for s in prepared.schedulers],
                 "loaders": [self._loader_position(loader) for loader in prepared.dataloaders]}
        return state

    def _loader_position(self, loader: Any) -> dict[str, Any] | None:
        """A loader's state, at the start of the step in progress: a forward took this quorum after the step's
        batch was drawn, so the healing group draws that batch again, with the others."""
        if not hasattr(loader, "state_dict"):
            return None
        position = dict(loader.state_dict())
        active = getattr(getattr(loader, "gradient_state", None), "active_dataloader", None) is loader
        if self.from_forward and active and position.get("batches_yielded", 0) > 0:
            position["batches_yielded"] -= 1
            position["end_of_dataloader"] = False
        return position

    def _load_state(self, state: dict[str, Any]) -> None:
        prepared = self.prepared
        assert prepared is not None
        for model, weights in zip(prepared.models, state["models"]):
            self.unwrap_model(model).load_state_dict(weights)
        for optimizer, values in zip(prepared.optimizers, state["optimizers"]):
            optimizer.load_state_dict(values)
        for scheduler, values in zip(prepared.schedulers, state["schedulers"]):
            scheduler.load_state_dict(values)
        if self.at_loader_start:  # a loader that is not iterating yet continues at the others' position
            for loader, position in zip(prepared.dataloaders, state["loaders"]):
                if position is not None:
                    loader.load_state_dict(position)
        self.reports.received_bytes = _nbytes(state)


class FaultTolerantStrategy(FaultTolerance, DDPStrategy):
    """DDP inside a replica group, torchft's fault-tolerant average across groups (see the module docstring)."""

    name = "ft_ddp"
    owns_backward = True  # the loss carries the average's division (see backward)

    def __init__(self, context: StrategyContext, settings: FaultTolerantSettings) -> None:
        super().__init__(context, settings)
        #: the step's gradients were back-propagated from a loss already divided by the number of processes
        #: that average them (all groups' together): the average has nothing left to divide
        self.prescaled = False

    @staticmethod
    def group_settings(settings: FaultTolerantSettings) -> DDPSettings:
        """DDP's options inside the group."""
        return DDPSettings(options=settings.options)

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """The one-process model path, then DDP around the model with the hook that averages across the
        groups (inside a group of several processes, their average first), and the hook that takes the step's
        quorum before its first training forward."""
        model = SingleDeviceStrategy.wrap_model(self, model, device_placement, evaluation_mode, hooks=hooks)
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        options = {k: v for k, v in self.options.ddp_kwargs().items() if k != "find_unused_parameters"}
        # The gradients are views of DDP's buckets, so that the averaged bucket is not copied back into them
        # (plain DDP folds that copy into its division; here the loss carries the division: see backward).
        options.setdefault("gradient_as_bucket_view", True)
        if world_size() > 1:
            _broadcast_from_first(model)  # DDP over torchft's placeholder group broadcasts nothing
        wrapped = ManagedDistributedDataParallel(self, model, **options)
        self.watch_steps(wrapped)
        return wrapped

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The module inside the data-parallel wrapper."""
        return model.module if isinstance(model, ManagedDistributedDataParallel) else model

    def backward(self, loss: torch.Tensor, precision: Any, sync_gradients: bool, **kwargs: Any) -> None:
        """Back-propagate ``loss`` divided by the number of processes the gradients are averaged over (this
        group's, times the groups in the step's quorum), as soon as the quorum is known (the step's first
        forward waited for it): the average is then a sum, with no pass of its own over the gradients (plain
        DDP divides as it copies each gradient into its bucket). A backward of a loss that did not come
        through here (``loss.backward()`` in the script) is divided by the average itself."""
        if self.open and self.participants:
            loss = loss / (self.participants * world_size())
            self.prescaled = True
        super().backward(loss, precision, sync_gradients, **kwargs)

    def step_ended(self, committed: bool) -> None:
        """The step's gradients are spent: the next step's backward divides its loss anew."""
        self.prescaled = False
        super().step_ended(committed)

    def average_bucket(self, bucket: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """``bucket`` averaged over this group's processes (when it has several), then across the groups."""
        if world_size() > 1:
            dist.all_reduce(bucket)
            if not self.prescaled:
                bucket.div_(world_size())
        if self.participants is None:  # no training forward waited for this step's quorum
            self.wait_quorum()
        participants = None if self.prescaled else self.participants
        return average_across_groups(self.manager, bucket, participants, self.participating)


class CommittingOptimizer(OptimizerWrapper):
    """torchft's ``OptimizerWrapper``: ``step`` steps only when the manager commits the step. The quorum is
    taken by the model's first training forward of the step, so ``zero_grad`` only zeroes (a script may call it
    before or after ``step``). ``step_was_skipped`` says whether the last step was dropped (the prepared
    scheduler then does not step)."""

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer,
                 step_ended: Callable[[bool], None]) -> None:
        super().__init__(manager, optimizer)
        self.defaults = optimizer.defaults
        self.step_was_skipped = False
        self._step_ended = step_ended

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (the quorum is taken elsewhere: see the class docstring)."""
        self.optim.zero_grad(set_to_none)

    def step(self, closure: object = None) -> None:
        """Step the optimizer when every group member may commit; otherwise drop the step."""
        if closure is not None:
            raise ValueError("fault-tolerant training does not take an optimizer closure")
        committed = self.manager.should_commit()
        if committed:
            self.optim.step()
        self.step_was_skipped = not committed
        self._step_ended(committed)


class ManagedDistributedDataParallel(nn.parallel.DistributedDataParallel):
    """DDP as torchft's ``DistributedDataParallel`` sets it up (a placeholder process group that does
    nothing, ``find_unused_parameters=True`` so that the buckets are never rebuilt: a group that heals must
    lay its buckets out as the live ones do), with a communication hook that survives a group lost mid-step
    (:meth:`FaultTolerantStrategy.average_bucket`). torchft's own hook waits for each bucket."""

    def __init__(self, strategy: FaultTolerantStrategy, module: nn.Module, **options: Any) -> None:
        super().__init__(module, process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True, **options)
        self.register_comm_hook(strategy, self._comm_hook)

    # No annotations: DDP checks them against real classes, and this module's are postponed strings.
    @staticmethod
    def _comm_hook(state, bucket):
        return state.average_bucket(bucket.buffer())


def average_across_groups(manager: Manager, tensor: torch.Tensor, participants: int | None,
                          participating: bool) -> torch.futures.Future[torch.Tensor]:
    """``tensor`` summed over the groups of the step's quorum through the manager's process group, divided by
    ``participants`` first (None: it is already); not waited for (the backward goes on while the sum runs, as
    in plain DDP). A group that is not ``participating`` (it heals in this step) adds zeros. When the sum
    fails (a peer was lost), the error is reported to the manager (the step will not be committed) and the
    future completes with ``tensor`` as it is, so that the backward ends without an error.

    torchft's ``Manager.allreduce`` does the same, but through its managed work and ``wrap_future``: a timer
    registered with its timeout thread for each bucket, profiler ranges, and the division on the
    communication thread after the sum (docs/machines.md, "The step's cost"). The process group's own timeout
    (``--timeout``) bounds the sum here."""
    if manager.errored() is None:
        if not participating:
            tensor.zero_()
        elif participants is not None:
            tensor.div_(participants)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
        try:
            work = manager._pg.allreduce([tensor], options)
        except Exception as exc:
            manager.report_error(exc)
        else:
            def summed(future: torch.futures.Future[Any]) -> torch.Tensor:
                try:
                    future.value()
                except Exception as exc:  # the step is dropped; the backward ends without an error
                    manager.report_error(exc)
                return tensor

            return work.get_future().then(summed)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(tensor)
    return done


#: glibc's ``mallopt`` parameters: the size above which a block is mapped on its own, and the free memory at
#: the top of the heap above which it is given back to the system
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: the values this mode sets: freed blocks up to 32 MB (glibc's largest mapping threshold) stay in the process
KEPT_BLOCK_BYTES, KEPT_TOP_BYTES = 32 << 20, 512 << 20


def _keep_freed_memory() -> None:
    """Keep freed memory of up to 32 MB a block in this process (glibc only; elsewhere nothing changes).

    By default glibc gives freed blocks of a few MB back to the system, and the next step touches them again
    page by page: in this mode, whose gradient buckets are never rebuilt (torchft's DDP), the gradients and
    the optimizer's temporaries were faulted in anew at every step on the CPU (docs/machines.md, "The step's
    cost"). Plain DDP escapes this by luck: the buffer its bucket rebuild frees raises glibc's threshold. A
    freed block is now kept for the next step, as jemalloc or tcmalloc would."""
    if platform.libc_ver()[0] != "glibc":
        return
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, KEPT_BLOCK_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, KEPT_TOP_BYTES)


def _broadcast_from_first(model: nn.Module) -> None:
    """The first process's parameters and buffers on every process of the group."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _nbytes(value: Any) -> int:
    """The bytes of the tensors in a nested state."""
    if isinstance(value, DTensor):  # this process's shard
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0
