"""Where an ``Accelerator`` runs and who it is: device, process index, the mesh's axes and their ranks, and
the process-control verbs (``wait_for_everyone``, ``main_process_first``, ``on_main_process``, ...).

``Accelerator`` inherits these; each is a view of the process state (``AcceleratorState``) or of the one
mesh owner (``ParallelMesh``), never a copy of either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from overdrive.accelerator.collectives import reports_hangs

if TYPE_CHECKING:
    import torch

    from overdrive.config import DistributedType
    from overdrive.resolve import TrainingPlan
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.strategies import StrategyBase
    from overdrive.strategies.deepspeed import DeepSpeedPlugin
    from overdrive.training.state import AcceleratorState


class ProcessSurface:
    """Accelerate's process and mesh properties on an object with ``state``, ``mesh``, ``plan`` and
    ``strategy``."""

    state: AcceleratorState
    mesh: ParallelMesh
    plan: TrainingPlan
    strategy: StrategyBase

    # -- where and who --------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device this process computes on (models and batches are placed there)."""
        return self.state.device

    @property
    def num_processes(self) -> int:
        """Processes in the job (the world size)."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is rank 0 on its machine."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """Whether this is the highest global rank."""
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.state.use_distributed

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's name for the kind of run (the strategy's, else the process state's)."""
        return self.strategy.distributed_type or self.state.distributed_type

    @property
    def mixed_precision(self) -> str:
        """The mixed precision in effect: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``."""
        return self.plan.precision.name

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The DeepSpeed plugin the next ``prepare()`` uses (``state.select_deepspeed_plugin`` chooses)."""
        return self.state.deepspeed_plugin

    # -- the device mesh: one axis per kind of parallelism --------------------------------------------
    @property
    def torch_device_mesh(self) -> Any:
        """The job's ``DeviceMesh`` (axes dp_replicate, dp_shard, cp, tp: those larger than 1), or None."""
        return self.mesh.mesh

    @property
    def data_parallel_size(self) -> int:
        """Processes that see different batches (replicate x shard)."""
        return self.mesh.size("dp")

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among those that see different batches."""
        return self.mesh.rank("dp")

    @property
    def data_parallel_shard_size(self) -> int:
        """Processes that shard the parameters between them (FSDP2's axis)."""
        return self.mesh.size("dp_shard")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index on the sharding axis."""
        return self.mesh.rank("dp_shard")

    @property
    def data_parallel_replicate_rank(self) -> int:
        """This process's index on the replication axis."""
        return self.mesh.rank("dp_replicate")

    @property
    def tensor_parallel_size(self) -> int:
        """Processes that split each layer's weights (tensor parallel)."""
        return self.mesh.size("tp")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index on the tensor-parallel axis."""
        return self.mesh.rank("tp")

    @property
    def context_parallel_size(self) -> int:
        """Processes that split each sequence (context parallel)."""
        return self.mesh.size("cp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index on the context-parallel axis."""
        return self.mesh.rank("cp")

    def maybe_context_parallel(self, buffers: list[torch.Tensor] | None = None,
                               buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[torch.Tensor] | None = None) -> contextlib.AbstractContextManager:
        """Split ``buffers`` along their sequence dims over the context-parallel axis and run attention as
        ring attention inside the block (forward and backward); nothing without context parallelism."""
        # lazy: loaded by the runs that split sequences only (DTensor's context parallel comes with it)
        from overdrive.transforms.context_parallel import context_parallel_region

        return context_parallel_region(self.mesh.get("cp"), buffers, buffer_seq_dims, no_restore_buffers,
                                       self.plan.cp_comm_strategy)

    # -- process control (delegated to the process state) ---------------------------------------------
    @reports_hangs
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this call (a barrier)."""
        self.state.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        self.state.print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager:
        """A block the main process runs before the others enter it (e.g. to download or cache once)."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager:
        """A block each machine's local main process runs before that machine's others enter it."""
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager:
        """A block that receives this process's contiguous share of ``inputs`` (a list, tuple, dict of
        them or a tensor); ``apply_padding`` repeats the last item so every share has the same length."""
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function: Callable) -> Callable:
        """``function`` wrapped to run only on the main process."""
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable) -> Callable:
        """``function`` wrapped to run only on each machine's local main process."""
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable) -> Callable:
        """``function`` wrapped to run only on the last process."""
        return self.state.on_last_process(function)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        """``function`` wrapped to run only on global rank ``process_index`` (a decorator when called
        without ``function``)."""
        return self.state.on_process(function, process_index=process_index)

    def on_local_process(self, function: Callable | None = None, local_process_index: int | None = None) -> Callable:
        """``function`` wrapped to run only on local rank ``local_process_index`` of each machine."""
        return self.state.on_local_process(function, local_process_index=local_process_index)
