"""Pipeline parallel: the model cut into stages over the mesh's ``pp`` axis, each stage wrapped by another
strategy (single, DDP over ``dp_replicate``, or FSDP2 / HSDP / tensor parallel) over the other axes.

This strategy does what is specific to a pipeline - cutting the model, the global gradient norm across
stages, the optimizer restricted to this rank's stages - and hands every stage to the stage strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.experimental import implicit_replication

from overdrive.config import DistributedType
from overdrive.resolve import PipelineStrategySettings
from overdrive.strategies.base import StrategyBase, StrategyContext, create_strategy
from overdrive.strategies.fsdp2 import by_mesh, total_grad_norm
from overdrive.transforms.path import apply_placement
from overdrive.transforms.pipeline.model import PipelinedModel, apply_pipeline
from overdrive.transforms.pipeline.schedule import PipelineRuntime
from overdrive.transforms.pipeline.ties import broadcast_stage, counted_elsewhere


class PipelineStrategy(StrategyBase):
    """Pipeline parallel over the mesh's ``pp`` axis; a stage strategy wraps each stage (see the module).

    Gradients (the defaults): the pipelined model's forward already ran the backward of its loss
    (whose autograd node is then a no-op), so ``backward`` only back-propagates terms added to the loss
    outside the model. ``no_sync`` does nothing: torch's schedules reduce gradients at the end of every
    step, and reducing a sum of steps again is still exact (the reduction is linear)."""

    name = "pipeline"
    settings_type = PipelineStrategySettings

    def __init__(self, context: StrategyContext, settings: PipelineStrategySettings) -> None:
        super().__init__(context, settings)
        self.mesh = context.mesh
        mesh, pp = context.mesh, context.mesh.get("pp")
        # everything was resolved by the plan: this only adds this process's place in the pipeline
        self.runtime = PipelineRuntime(
            schedule=settings.schedule, num_microbatches=settings.num_microbatches,
            stages_per_rank=settings.stages_per_rank, device=context.device, pp_size=mesh.size("pp"),
            pp_rank=mesh.rank("pp"), pp_group=pp.get_group() if pp is not None else None,
            split_points=list(settings.split_points) if settings.split_points else None, balance=settings.balance,
            loss_fn=settings.loss_fn, window=context.window, speaks_for_stage=mesh.rank("dp_cp_tp") == 0, mesh=mesh)
        # Each stage is made equal over the processes holding it (and tied weights over their stages) once
        # it is on the device; the stage strategy then has nothing to synchronise.
        self.sync_module_states = settings.sync_module_states
        self.stage_strategy = create_strategy(settings.stage_strategy, context, settings.stage_settings)
        self.runtime.no_sync = self.stage_strategy.no_sync
        self._models: list[PipelinedModel] = []
        # ids of the parameters of the models cut into stages, and of those this rank's stages hold
        self._cut: set[int] = set()
        self._mine: set[int] = set()

    @property
    def distributed_type(self) -> DistributedType | None:
        """The stage strategy's ``distributed_type``."""
        return self.stage_strategy.distributed_type

    # -- the model ---------------------------------------------------------------------------------
    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """Cut ``model`` into stages; each of this rank's stages goes through :meth:`wrap_stage`."""
        self._cut |= {id(p) for p in model.parameters()}
        settings = dataclasses.replace(self.runtime)  # each model its own cut and tied weights
        pipelined = apply_pipeline(model, settings, lambda stage: self.wrap_stage(
            stage, settings, device_placement, evaluation_mode, hooks=hooks))
        self._models.append(pipelined)
        return pipelined

    def wrap_stage(self, stage: nn.Module, settings: PipelineRuntime, device_placement: bool = True,
                   evaluation_mode: bool = False, *, hooks: list[Any]) -> nn.Module:
        """One stage of this rank: alone on the device (the rest of the model stays where it was built; as it
        is when the stage strategy does not place it), made equal over the processes holding it (tied weights
        over their stages, ``sync_module_states``), then the stage strategy's model path."""
        self._mine |= {id(p) for p in stage.parameters()}
        if self.stage_strategy.places_model(device_placement):
            stage = apply_placement(stage, self.device, self.stage_strategy.meta_remedy)
        if self.sync_module_states:
            stage_group = self.mesh.get("dp_cp_tp")
            broadcast_stage(stage, stage_group.get_group() if stage_group is not None else None, settings.ties)
        return self.stage_strategy.wrap_model(stage, device_placement, evaluation_mode, hooks=hooks)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's model class holding this rank's (first) stage."""
        return model.stage_models[0] if isinstance(model, PipelinedModel) else model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> torch.optim.Optimizer:
        """Keep only the parameters of this rank's stages, then let the stage strategy re-point them."""
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in self._cut or id(p) in self._mine]
        return self.stage_strategy.prepare_optimizer(optimizer, models)

    # -- gradients ---------------------------------------------------------------------------------
    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float,
                        norm_type: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient: this rank's stages' norm (reduced over their
        data- and tensor-parallel peers), combined over the pipeline ranks."""
        groups = by_mesh([p for p in parameters if p.grad is not None])
        again = {i for m in self._models for i in counted_elsewhere(m, m.settings.ties, m.settings.pp_rank)}
        local = total_grad_norm([grad for group in groups for p in group
                                 if id(p) not in again and (grad := p.grad) is not None], norm_type)
        total = combine_norms(local.to(self.device), float(norm_type), self.runtime.pp_group)
        with implicit_replication():
            for group in groups:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total


def combine_norms(local: torch.Tensor, norm_type: float, group: Any) -> torch.Tensor:
    """The norm of the union of disjoint gradient sets, from each pipeline rank's norm of its own set."""
    if group is None:
        return local
    if math.isinf(norm_type):
        value = local.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return value
    value = local.double().pow(norm_type)
    dist.all_reduce(value, group=group)
    return value.pow(1.0 / norm_type).to(local.dtype)
