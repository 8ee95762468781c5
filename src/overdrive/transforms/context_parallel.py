"""Context parallel: the sequence is split across the ``cp`` axis and attention runs as ring attention.

torch's ``context_parallel`` shards the given buffers (input ids, labels, position ids, ...) along their
sequence dimension in place and swaps ``scaled_dot_product_attention`` for a ring implementation while
the context is open; forward *and* backward must run inside it::

    with accelerator.maybe_context_parallel(buffers=[ids, labels, positions], buffer_seq_dims=[1, 1, 1],
                                            no_restore_buffers={ids, labels, positions}):
        loss = loss_fn(model(ids, position_ids=positions), labels)
        accelerator.backward(loss)

FSDP2 shards parameters over ``dp_shard x cp`` so that gradients average over every rank that saw a
different slice of the data. torch has no sharding rule for attention on the CPU (flash, efficient or
math): ``cp_size > 1`` on a CPU is refused when the Accelerator is built, before training starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from overdrive.config.choices import invalid_choice
from overdrive.runtime.torch_private import set_context_parallel_rotate_method

COMM_STRATEGIES = ("allgather", "alltoall")


def context_parallel_problem(cp_size: int, device: torch.device, comm_strategy: str = "allgather") -> str | None:
    """Why ``cp_size`` cannot run on ``device`` (None when it can)."""
    if cp_size > 1 and device.type == "cpu":
        return (f"cp_size={cp_size} asks for context parallelism, which needs CUDA: torch has no sharding rule "
                "for scaled_dot_product_attention on the CPU; run on GPUs or use cp_size=1")
    if comm_strategy not in COMM_STRATEGIES:
        return invalid_choice(f"cp_comm_strategy={comm_strategy!r}", comm_strategy, COMM_STRATEGIES)
    return None


def comm_strategy_of(cp_handler: Any) -> str:
    """``cp_comm_strategy`` of a dict or object (default "allgather")."""
    if cp_handler is None:
        return "allgather"
    if isinstance(cp_handler, dict):
        return str(cp_handler.get("cp_comm_strategy", "allgather"))
    return str(getattr(cp_handler, "cp_comm_strategy", "allgather"))


@contextlib.contextmanager
def context_parallel_region(cp_mesh: Any, buffers: Iterable[torch.Tensor] | None = None,
                            buffer_seq_dims: Iterable[int] | None = None,
                            no_restore_buffers: Iterable[torch.Tensor] | None = None,
                            comm_strategy: str = "allgather") -> Iterator[None]:
    """Run the block with the sequence of ``buffers`` split over ``cp_mesh`` (nothing when it is None)."""
    if cp_mesh is None:
        yield
        return
    # lazy: the resolver reads this module's checks at every start; DTensor's context parallel loads only here
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel  # lazy: as above

    buffers = list(buffers or [])
    dims = list(buffer_seq_dims) if buffer_seq_dims is not None else [1] * len(buffers)
    if len(dims) != len(buffers):
        raise ValueError(f"maybe_context_parallel got {len(buffers)} buffers but {len(dims)} buffer_seq_dims")
    set_context_parallel_rotate_method(comm_strategy)
    # Ring attention exists for the flash, memory-efficient and cuDNN kernels, not for the math one.
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(backends), context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=dims,
                                                 no_restore_buffers=set(no_restore_buffers or ())):
        yield
