"""How the processes of a job divide the work: ``ParallelismConfig`` and the tensor-parallel settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overdrive.config.pipeline import PipelineConfig


@dataclass
class TorchTensorParallelPlugin:
    """Tensor parallelism (``torch.distributed.tensor.parallel``) over ``tp_size`` processes.

    ``tp_plan`` maps module-name patterns (``*`` stands for one name component, e.g. ``"layers.*.mlp.up"``)
    to a style: ``"colwise"``, ``"rowwise"``, ``"colwise_rep"`` (colwise, output gathered),
    ``"sequence_parallel"`` or ``"replicate"``. Without a plan the transformer blocks are recognised by
    their structure (attention q/k/v/o and MLP up/gate/down). ``sequence_parallel`` also shards the norms
    and dropouts of each block along the sequence dimension. ``torch_device_mesh`` is accepted for
    Accelerate compatibility; overdrive builds the mesh itself from ``ParallelismConfig``.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None
    tp_plan: dict[str, str] | None = None
    sequence_parallel: bool = False



@dataclass
class ParallelismConfig:
    """How the processes of a job divide the work: one device mesh with named axes.

    ``dp_replicate_size`` x ``dp_shard_size`` x ``cp_size`` x ``tp_size`` (x ``pp_size``) must equal the
    number of processes; one of them may be -1 to take what is left. ``dp_shard_size > 1`` shards
    parameters with FSDP2 (with ``dp_replicate_size > 1`` too: HSDP); ``tp_size`` is tensor parallel and
    ``cp_size`` context parallel (sequence split across processes, CUDA only). ``pp_size`` is pipeline
    parallel (the model cut into stages), set up by ``pp_handler``, a ``PipelineConfig``::

        Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
        Accelerator(parallelism_config=ParallelismConfig(pp_size=2, dp_shard_size=2,
                                                         pp_handler=PipelineConfig(schedule="1F1B")))
    """

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    pp_size: int = 1
    #: context parallelism's back end; Accelerate's one choice, ``"torch"``.
    cp_backend: str = "torch"
    #: DeepSpeed Ulysses sequence parallelism (Accelerate's ``sp_size`` / ``sp_backend="deepspeed"``): accepted
    #: with size 1 only (``Accelerator`` refuses more, naming ``cp_size`` as overdrive's sequence split).
    sp_size: int = 1
    sp_backend: str = "deepspeed"
    #: tensor-parallel settings (plan, sequence parallel); a ``TorchTensorParallelPlugin``.
    tp_handler: TorchTensorParallelPlugin | None = None
    #: context-parallel settings: a dict or object with ``cp_comm_strategy`` ("allgather" or "alltoall").
    cp_handler: Any = None
    #: pipeline settings (schedule, micro-batches, stages per rank, split points, loss function); a
    #: ``PipelineConfig`` (or a dict of its fields). Used when ``pp_size > 1``.
    pp_handler: PipelineConfig | dict | None = None

    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether data-parallel replication is on (``dp_replicate_size > 1``)."""
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether parameters are sharded (``dp_shard_size > 1``)."""
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is on (``tp_size > 1``)."""
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is on (``cp_size > 1``)."""
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        """Whether DeepSpeed Ulysses sequence parallelism is asked for (``sp_size > 1``; refused by overdrive)."""
        return self.sp_size > 1

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh axes FSDP works over (as ``accelerator.torch_device_mesh[...]`` names them):
        ``["dp_replicate", "dp_shard_cp"]`` with replication, else ``["dp_shard_cp"]``."""
        return [*(["dp_replicate"] if self.dp_replicate_enabled else []), "dp_shard_cp"]

    def sizes(self) -> dict[str, int]:
        """The axis sizes by mesh axis name."""
        return {"pp": self.pp_size, "dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size,
                "cp": self.cp_size, "tp": self.tp_size}
