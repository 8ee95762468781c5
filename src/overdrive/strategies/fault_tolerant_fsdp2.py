"""Fault-tolerant HSDP through torchft (``--ft_lighthouse`` with FSDP2, the strategy ``ft_fsdp2``).

Inside each replica group the model is sharded with FSDP2 (``fully_shard``) over the group's own processes
(the shard axis), and the groups are the replicate axis, managed by torchft: after FSDP2's reduce-scatter
gives each process its shard of the group's gradient, the all-reduce hook FSDP2 offers for this averages that
shard across the groups through torchft's ``ManagedProcessGroup`` (the processes of one shard rank, one per
group, which the manager reconfigures at every quorum), as torchtitan's torchft integration does. The step,
the commit, the data split and the reports are the fault-tolerant data parallel's (``fault_tolerant.py``); a
healing group's processes each receive the sharded weights and optimizer state of the live group's process
with the same shard rank, over torchft's checkpoint transport.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torchft.process_group import ManagedProcessGroup

from overdrive.resolve import FaultTolerantSettings, FSDP2Settings
from overdrive.strategies.base import StrategyContext
from overdrive.strategies.fault_tolerant import FaultTolerance
from overdrive.strategies.fsdp2 import FSDP2Strategy


class FaultTolerantFSDP2Strategy(FaultTolerance, FSDP2Strategy):
    """FSDP2 inside a replica group, torchft's fault-tolerant average of the gradient shards across groups
    (see the module docstring)."""

    name = "ft_fsdp2"

    def __init__(self, context: StrategyContext, settings: FaultTolerantSettings) -> None:
        super().__init__(context, settings)
        #: the same shard rank's process of every group in the quorum (torchft's replicate axis)
        self.replicas = ManagedProcessGroup(self.manager)
        #: each prepared model's sharded parameters and buffers by state-dict name, as ``fully_shard`` left them
        self._sharded_state: weakref.WeakKeyDictionary[nn.Module, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()

    @staticmethod
    def group_settings(settings: FaultTolerantSettings) -> FSDP2Settings:
        """FSDP2's plugin inside the group."""
        assert settings.fsdp is not None  # the resolver names this strategy only with it
        return FSDP2Settings(fsdp=settings.fsdp)

    def wrap_model(self, model: nn.Module, device_placement: bool = True, evaluation_mode: bool = False, *,
                   hooks: list[Any]) -> nn.Module:
        """FSDP2's model path over the group's processes, then on every sharded module the hook that averages
        its gradient shard across the groups, and the hook that takes the step's quorum before its first
        training forward."""
        model = FSDP2Strategy.wrap_model(self, model, device_placement, evaluation_mode, hooks=hooks)
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            raise ValueError("fault-tolerant FSDP2 (--ft_lighthouse with FSDP) found no sharded module in the "
                             "model: each replica group needs 2 or more processes to shard over")
        for module in sharded:
            module.set_all_reduce_hook(self._average_across_groups)
        # FSDP2's own state_dict() swaps the sharded parameters back in, which must not happen on torchft's
        # quorum thread while this process's forward or backward uses the gathered ones: the sharded
        # parameters (and buffers) are taken now, by their state-dict names, and read from there
        self._sharded_state[model] = model.state_dict(keep_vars=True)
        self.watch_steps(model)
        return model

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """This process's shard of ``model``'s weights (DTensors) and its buffers, without FSDP2's state-dict
        hooks (see :meth:`wrap_model`)."""
        state = self._sharded_state.get(model)
        return model.state_dict() if state is None else {name: t.detach() for name, t in state.items()}

    def _average_across_groups(self, shard: torch.Tensor) -> None:
        """The group's gradient shard averaged over the groups of the quorum, in place (a healing group adds
        zeros and divides as the others). When the sum fails (a group was lost), the manager records the
        error, the step is not committed, and the shard keeps a value that is never stepped with."""
        dist.all_reduce(shard, op=dist.ReduceOp.AVG, group=self.replicas)
