"""How the processes of a job divide the work: ``ParallelismConfig`` and the tensor-parallel settings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

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
class TorchContextParallelConfig:
    """Context parallelism's settings (Accelerate's ``cp_handler``): ``cp_comm_strategy``, ``"allgather"`` or
    ``"alltoall"``; ``None`` reads ``PARALLELISM_CONFIG_CP_COMM_STRATEGY`` (``"allgather"`` when unset)."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or "
                             "'alltoall'.")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed Ulysses sequence parallelism's settings (Accelerate's ``sp_handler``), checked as Accelerate
    checks them; overdrive's ``Accelerator`` refuses ``sp_size > 1`` (use ``cp_size``). ``None`` fields read
    ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE`` / ``_SP_SEQ_LENGTH`` / ``_SP_ATTN_IMPLEMENTATION`` /
    ``_SP_ALLOW_RECURRENT_LAYERS`` (default false) / ``_SP_DISABLE_IN_EVAL`` (default true)."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None
    #: let models with recurrent layers (which see only their own sequence shard) be split anyway
    sp_allow_recurrent_layers: bool | None = None
    #: run evaluation (``model.eval()``) on whole sequences, without the sequence split
    sp_disable_in_eval: bool | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            variable = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true")
            self.sp_seq_length_is_variable = variable.lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            length = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            if length is None:
                raise ValueError("sp_seq_length_is_variable=False needs sp_seq_length (or the variable "
                                 "PARALLELISM_CONFIG_SP_SEQ_LENGTH): the one sequence length of every batch")
            self.sp_seq_length = None if length == "None" else int(length)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        if self.sp_allow_recurrent_layers is None:
            allow = os.environ.get("PARALLELISM_CONFIG_SP_ALLOW_RECURRENT_LAYERS", "false")
            self.sp_allow_recurrent_layers = allow.lower() == "true"
        if self.sp_disable_in_eval is None:
            self.sp_disable_in_eval = os.environ.get("PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL", "true").lower() == "true"
        kernel = self.sp_attn_implementation
        if kernel is not None and kernel not in _SP_ATTENTION and not ("/" in kernel and "flash-attn" in kernel):
            raise ValueError(f"Invalid sp_attn_implementation: {kernel!r}. Must be one of {list(_SP_ATTENTION)} or "
                             "a hub-hosted flash attention kernel (e.g. 'kernels-community/flash-attn2')")


_SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")
#: canonical order of the mesh axes (outermost first), as Accelerate's ``_get_mesh`` and overdrive's mesh
_MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
#: "read it from the environment": Accelerate's default for the sizes (typed as the int it becomes)
_FROM_ENV = cast(int, None)


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

    #: a size left ``None`` reads ``PARALLELISM_CONFIG_<NAME>`` (what ``launch --parallelism_config_*`` sets),
    #: else 1 (as Accelerate)
    dp_replicate_size: int = _FROM_ENV
    dp_shard_size: int = _FROM_ENV
    tp_size: int = _FROM_ENV
    cp_size: int = _FROM_ENV
    pp_size: int = 1
    #: context parallelism's back end; Accelerate's one choice, ``"torch"`` (``None``: the variable, else that).
    cp_backend: str = cast(str, None)
    #: DeepSpeed Ulysses sequence parallelism (Accelerate's ``sp_size`` / ``sp_backend="deepspeed"``): accepted
    #: with size 1 only (``Accelerator`` refuses more, naming ``cp_size`` as overdrive's sequence split).
    sp_size: int = _FROM_ENV
    sp_backend: str = cast(str, None)
    #: tensor-parallel settings (plan, sequence parallel); a ``TorchTensorParallelPlugin``.
    tp_handler: TorchTensorParallelPlugin | None = None
    #: context-parallel settings: a dict or object with ``cp_comm_strategy`` ("allgather" or "alltoall").
    cp_handler: Any = None
    #: pipeline settings (schedule, micro-batches, stages per rank, split points, loss function); a
    #: ``PipelineConfig`` (or a dict of its fields). Used when ``pp_size > 1``.
    pp_handler: PipelineConfig | dict | None = None
    #: sequence-parallel settings, a ``DeepSpeedSequenceParallelConfig`` (made when ``sp_size > 1``)
    sp_handler: Any = None
    #: the mesh ``get_device_mesh`` built (Accelerate's attribute)
    device_mesh = None

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            if getattr(self, f"{name}_size") is None:
                variable = f"PARALLELISM_CONFIG_{name.upper()}_SIZE"
                setattr(self, f"{name}_size", _int_variable(variable, os.environ.get(variable, "1")))
        if self.cp_backend is None:
            self.cp_backend = os.environ.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()

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

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled data-parallel axes (``dp_replicate``, ``dp_shard``): flattened into ``dp``."""
        return [a for a in ("dp_replicate", "dp_shard") if self._size(a) > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled axes whose processes get the same batch (``tp``, ``cp``, ``sp``)."""
        return [a for a in ("tp", "cp", "sp") if self._size(a) > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled axes FSDP shards the model over (``dp_shard``, ``cp``): flattened into ``dp_shard_cp``."""
        return [a for a in ("dp_shard", "cp") if self._size(a) > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled axes the loss is averaged over: flattened into ``dp_cp``."""
        return [a for a in ("dp_replicate", "dp_shard", "cp") if self._size(a) > 1]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every enabled axis (data-parallel ones first)."""
        return [*(["pp"] if self.pp_size > 1 else []), *self.dp_dim_names, *self.non_dp_dim_names]

    @property
    def total_size(self) -> int:
        """The number of processes the sizes describe (their product)."""
        return self.data_parallel_size * self.non_data_parallel_size * self.pp_size

    @property
    def data_parallel_size(self) -> int:
        """``dp_replicate_size * dp_shard_size``."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        """``tp_size * cp_size * sp_size``."""
        return self.tp_size * self.cp_size * self.sp_size

    def sizes(self) -> dict[str, int]:
        """The axis sizes by mesh axis name."""
        return {"pp": self.pp_size, "dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size,
                "cp": self.cp_size, "tp": self.tp_size}

    def _size(self, axis: str) -> int:
        return getattr(self, f"{axis}_size")

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(axis names, sizes) of the enabled axes in mesh order, for ``init_device_mesh``."""
        axes = sorted(self.active_mesh_dims, key=_MESH_ORDER.index)
        return tuple(axes), tuple(self._size(a) for a in axes)

    def build_device_mesh(self, device_type: str) -> Any:
        """``init_device_mesh`` over the enabled axes, with the joint axes ``dp``, ``dp_shard_cp`` and ``dp_cp``
        flattened in (as Accelerate builds it); None when no axis is enabled or for DeepSpeed's sequence
        parallelism (DeepSpeed makes its own groups). Every size must be given (no -1)."""
        if self.sp_backend == "deepspeed" and self.sp_size > 1:
            return None
        names, shape = self._get_mesh()
        if not names:
            return None
        if any(size < 1 for size in shape):
            raise ValueError(f"build_device_mesh needs every size: got {dict(zip(names, shape))}; replace -1 by the "
                             "size it stands for")
        from torch.distributed.device_mesh import init_device_mesh  # lazy: config/ loads no torch

        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        for joint, axes in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names),
                            ("dp_cp", self.dp_cp_dim_names)):
            if axes:  # indexed by the list of names, as Accelerate does (torch's stubs say tuple)
                cast(Any, mesh)[axes]._flatten(joint)
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built once by ``build_device_mesh(device_type)`` and kept in ``device_mesh``."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("get_device_mesh() needs a device_type (e.g. 'cuda' or 'cpu') to build the mesh")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(f"the device mesh was built for {self.device_mesh.device_type!r}, not {device_type!r}")
        return self.device_mesh


def _int_variable(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a whole number of processes") from None
