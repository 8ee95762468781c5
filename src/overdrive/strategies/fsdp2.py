"""Sharded and model-parallel training: FSDP2 (``fully_shard``), HSDP, tensor and context parallel.

The model goes through FSDP2's model path (``FSDP2Strategy.wrap_model``), whose last step is
``fully_shard`` over the job's mesh. ``fully_shard`` and tensor parallel replace parameters with DTensor parameters, so an
optimizer built on the original parameters is pointed at the new ones (``prepare_optimizer``). Precision is
FSDP2's ``MixedPrecisionPolicy`` when parameters are sharded, and autocast hooks otherwise (tensor parallel
only, or one process). With ``cpu_ram_efficient_loading`` only rank 0 holds real weights: the model is
moved to the meta device, sharded, then filled from rank 0.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication

from overdrive.config import DistributedType
from overdrive.resolve import FSDP2Settings
from overdrive.runtime import group as process_group
from overdrive.runtime.torch_private import REDISTRIBUTE_LOGGER
from overdrive.strategies.base import StrategyBase, StrategyContext
from overdrive.transforms.fully_shard import (
    apply_fully_shard,
    broadcast_module_states,
    fully_shard_settings,
    load_from_rank0,
    non_persistent_buffers,
)
from overdrive.transforms.path import Replaced, apply_placement, apply_precision_hooks, refuse_meta

_META_REMEDY = (", or let rank 0 hold the weights and pass FullyShardedDataParallelPlugin("
                "cpu_ram_efficient_loading=True) with data-parallel sharding")


class FSDP2Strategy(StrategyBase):
    """FSDP2 (``fully_shard``), HSDP, tensor and context parallel over the job's mesh (see the module).
    ``backward`` is the precision's (the default): FSDP2's hooks reduce-scatter the gradients during it,
    unless ``no_sync`` turned that off."""

    name = "fsdp2"
    settings_type = FSDP2Settings
    meta_remedy = _META_REMEDY

    def __init__(self, context: StrategyContext, settings: FSDP2Settings) -> None:
        super().__init__(context, settings)
        self.mesh = context.mesh
        self.fsdp = settings.fsdp
        # id(original parameter) -> (weak references to it and to the module that owns it, attribute name)
        self._owners: dict[int, tuple[weakref.ref, weakref.ref, str]] = {}

    @property
    def distributed_type(self) -> DistributedType | None:
        """``DistributedType.FSDP`` when parameters are sharded; ``None`` (the device's MULTI_*) otherwise."""
        return DistributedType.FSDP if self.mesh.dims.shards_parameters else None

    @property
    def shards_parameters(self) -> bool:
        """Whether the mesh has a data-parallel shard axis, so that ``fully_shard`` runs."""
        return self.mesh.fsdp_mesh() is not None

    # -- the model ---------------------------------------------------------------------------------
    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """FSDP2's model path (in evaluation mode too). The model is placed whatever ``device_placement`` says
        (``fully_shard`` needs it on the device), made equal on every rank (``sync_module_states``); with
        ``cpu_ram_efficient_loading`` instead rank 0's weights are kept aside, the model sharded on the meta
        device, then filled from rank 0. Which module holds each parameter is recorded before tensor parallel
        and ``fully_shard`` replace them, so that optimizers can be pointed at the new ones."""
        transforms, sharded, from_rank0 = self.context.transforms, self.shards_parameters, self._loads_from_rank0
        full: dict[str, torch.Tensor] = {}  # rank 0's weights and non-persistent buffers, under rank-0 loading
        buffers: dict[str, torch.Tensor] = {}
        if from_rank0:
            full, buffers = self._keep_rank0_weights(model)
            model = model.to("meta")
        else:
            model = apply_placement(model, self.device, self.meta_remedy)
            if self.fsdp.sync_module_states and self.mesh.dims.world_size > 1:
                broadcast_module_states(model)
        if not sharded:  # sharded, FSDP2's MixedPrecisionPolicy casts instead
            hooks += apply_precision_hooks(model, self.context.precision)
        replaced: Replaced = {}
        if transforms.fp8 is not None and not from_rank0:  # torchao's float8 weights cannot be on meta
            replaced = self.apply_fp8(model)
        self._record_owners(model, replaced)
        blocks = self.apply_model_transforms(model, find_blocks=True)
        if sharded:
            apply_fully_shard(model, self.mesh.fsdp_mesh(), fully_shard_settings(model, transforms, blocks))
        if from_rank0:
            load_from_rank0(model, full, buffers, self.device)
        return model

    @property
    def _loads_from_rank0(self) -> bool:
        return self.fsdp.cpu_ram_efficient_loading and self.shards_parameters

    def places_model(self, device_placement: bool) -> bool:
        """Always, except under rank-0 loading (see :meth:`wrap_model`)."""
        return not self._loads_from_rank0

    def _keep_rank0_weights(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Record the parameters' owners; on rank 0 return its full weights and non-persistent buffers (the
        other ranks may hold the model on the meta device: nothing)."""
        self._record_owners(model)
        if process_group.rank() != 0:
            return {}, {}
        refuse_meta(model, " (cpu_ram_efficient_loading: rank 0 must hold the real weights)")
        return model.state_dict(), non_persistent_buffers(model)

    def _record_owners(self, model: nn.Module, replaced: dict[int, Any] | None = None) -> None:
        """Remember which module attribute holds each parameter, so that an optimizer built on them can be
        pointed at what fully_shard puts there; a parameter fp8 replaced maps to its replacement's place."""
        where = {}
        for module in model.modules():
            for attribute, param in module.named_parameters(recurse=False):
                where[id(param)] = (weakref.ref(module), attribute)
                self._owners[id(param)] = (weakref.ref(param), weakref.ref(module), attribute)
        for old_id, (old_ref, new) in (replaced or {}).items():
            if id(new) in where:
                self._owners[old_id] = (old_ref, *where[id(new)])

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """Point ``optimizer`` at the sharded parameters that replaced the ones it was built with."""
        for group in optimizer.param_groups:
            group["params"] = [self._current(p, optimizer) for p in group["params"]]
        return optimizer

    def _current(self, param: torch.Tensor, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        entry = self._owners.get(id(param))
        owner = entry[1]() if entry is not None and entry[0]() is param else None
        if entry is None or owner is None:
            return param  # not from a prepared model, or already the sharded one
        new = getattr(owner, entry[2])
        if new is not param and optimizer.state.get(param):
            raise ValueError("prepare() got an optimizer that has already stepped: its state belongs to the "
                             "unsharded parameters; prepare the optimizer before its first step")
        return new

    # -- gradient synchronisation ------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """No gradient reduction in the backwards inside (``set_requires_gradient_sync(False)``)."""
        with self._gradient_sync(model, False):
            yield

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Turn FSDP2's gradient reduction on for the backward inside, even within ``no_sync``."""
        with self._gradient_sync(model, True):
            yield

    @contextlib.contextmanager
    def _gradient_sync(self, model: nn.Module, value: bool) -> Iterator[None]:
        if not isinstance(model, FSDPModule):
            yield  # tensor parallel alone: every gradient is complete after backward
            return
        model.set_requires_gradient_sync(value)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(not value)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """Clip by the norm of every gradient, sharded or not, on whatever mesh it lives."""
        groups = by_mesh([p for p in parameters if p.grad is not None])
        total = total_grad_norm([g for group in groups for g in _grads(group)], norm_type)
        with implicit_replication():  # the plain total norm scales DTensor gradients as a replicated scalar
            for group in groups:  # one mesh per call: torch's foreach cannot mix meshes
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _mesh_key(tensor: torch.Tensor) -> Any:
    return (tensor.device_mesh, tuple(tensor.placements)) if isinstance(tensor, DTensor) else None


def by_mesh(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by (mesh, placements) of their gradients; plain tensors form one group."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(_mesh_key(tensor.grad if tensor.grad is not None else tensor), []).append(tensor)
    return list(groups.values())


@contextlib.contextmanager
def _quiet_redistribute() -> Iterator[None]:
    """Without DTensor's warning that a norm partial over a 2-D mesh takes two sequential all-reduces: every
    rank would print it on every clip, and the user cannot act on it (the reductions are exact: sums of
    powers, then the root)."""
    log = logging.getLogger(REDISTRIBUTE_LOGGER)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def total_grad_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The norm of all ``grads`` together, as a plain tensor equal on every process.

    DTensor gradients are grouped by mesh and placements (tensor-parallel ones live on a 2-D mesh, others
    on the data-parallel mesh only); each group's norm is reduced over its mesh, then the groups are
    combined. Plain gradients are complete on every process and count as they are.
    """
    norm_type = float(norm_type)
    norms = []
    for group in by_mesh(grads):
        with _quiet_redistribute():  # stacking the per-tensor norm partials redistributes them too
            norm = torch.nn.utils.get_total_norm(group, norm_type)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.tensor(0.0)
    device = norms[0].device
    norms = [n.to(device) for n in norms]
    if math.isinf(norm_type):
        return torch.stack(norms).max()
    return torch.stack(norms).pow(norm_type).sum().pow(1.0 / norm_type)

