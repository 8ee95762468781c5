"""The one model path: what ``prepare()`` does to a model, in one fixed order, under every strategy.

1. placement on the device (a model on the meta device is refused here, and only here);
2. precision hooks (autocast around forward) unless FSDP2's ``MixedPrecisionPolicy`` does it;
3. fp8 conversion (the hook point for ``ModelTransforms.fp8``);
4. tensor parallel (context parallel changes no module);
5. activation checkpointing of the repeated blocks;
6. compile, in place: the whole model, or each repeated block (regional compilation);
7. data parallel: FSDP2's ``fully_shard`` over the mesh, or the strategy's wrapper (DDP).

Steps 4-7 are :func:`overdrive.transforms.apply_parallelism`. The strategies differ only in step 7, so
compile and activation checkpointing mean the same whatever the strategy. DeepSpeed runs
``apply_parallelism`` on the model before it builds the engine, which then does steps 1-2 and 7 itself
(placement, its bf16 / fp16 block, ZeRO).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from overdrive.config import FullyShardedDataParallelPlugin
from overdrive.precision import PrecisionPolicy

if TYPE_CHECKING:
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.transforms.hooks import HookRegistry


@dataclass(frozen=True)
class CompileSettings:
    """``torch.compile`` options (from ``TorchDynamoPlugin`` or ``dynamo_backend``), resolved."""

    backend: str = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    #: compile each repeated block (once per distinct block class) instead of the whole model
    regional: bool = False

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile`` / ``Module.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic,
                                  "disable": self.disable}
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs


@dataclass(frozen=True)
class ModelTransforms:
    """What to do to every prepared model, independent of the model and of the strategy."""

    tp_plan: dict[str, str] | None = None
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    #: class names of the blocks to checkpoint and compile (default: FSDP's wrap names, else the repeated blocks)
    block_names: tuple[str, ...] = ()
    compile: CompileSettings | None = None
    fsdp: FullyShardedDataParallelPlugin = field(default_factory=FullyShardedDataParallelPlugin)
    precision: PrecisionPolicy = field(default_factory=PrecisionPolicy)
    #: the fp8 recipe (``AORecipeKwargs`` / ``TERecipeKwargs``): ``precision.fp8.apply_fp8`` converts the linear
    #: layers right after placement, so tensor parallel, compile and data parallel see float8 modules
    fp8: Any = None


def refuse_meta(model: nn.Module, remedy: str = "") -> None:
    """Fail if ``model`` has parameters on the meta device: there are no weights to train."""
    on_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if on_meta:
        shown = ", ".join(on_meta[:5]) + (", ..." if len(on_meta) > 5 else "")
        raise ValueError(
            f"prepare() got a model with {len(on_meta)} parameters on the meta device ({shown}); materialise it "
            f"first (model.to_empty(device=...) then load its weights){remedy}")


def apply_model_path(model: nn.Module, mesh: ParallelMesh, transforms: ModelTransforms, *,
                     device: torch.device | None, precision: Any, hooks: HookRegistry,
                     data_parallel: Callable[[nn.Module], nn.Module] | None = None, meta_remedy: str = "",
                     fp8_replaced: dict[int, Any] | None = None,
                     before_parallel: Callable[[nn.Module, dict[int, Any]], None] | None = None) -> nn.Module:
    """Run the model path on ``model``; return what trains (``model`` itself unless ``data_parallel``
    wraps it). ``device=None`` skips placement (the model is already where it belongs: on the meta
    device for FSDP's rank-0 loading). ``precision`` is the Accelerator's ``AmpPrecision``.

    The parameters fp8 conversion replaced go into ``fp8_replaced`` (``id(old) -> (weakref(old), new)``)
    so that optimizers built on the old ones can be pointed at the new ones; ``before_parallel(model,
    replaced)`` runs after the conversion and before tensor parallel / sharding (FSDP2 records there which
    module holds each parameter)."""
    if device is not None:
        refuse_meta(model, meta_remedy)
        model = model.to(device)
    if mesh.fsdp_mesh() is None:  # sharded parameters take FSDP2's MixedPrecisionPolicy instead
        hooks.add(precision.attach(model))
    replaced: dict[int, Any] = {}
    if transforms.fp8 is not None and device is not None:  # (torchao's float8 weights cannot be on meta)
        from overdrive.precision.fp8 import apply_fp8

        replaced = apply_fp8(model, transforms.fp8)
        if fp8_replaced is not None:
            fp8_replaced.update(replaced)
    if before_parallel is not None:
        before_parallel(model, replaced)
    apply_parallelism(model, mesh, transforms)
    return data_parallel(model) if data_parallel is not None else model

def apply_parallelism(model: nn.Module, mesh: ParallelMesh, config: ModelTransforms) -> nn.Module:
    """Apply every parallelism ``config`` asks for to ``model``, in place, over ``mesh``. Each transform's
    module is imported only when it is used (one process with no transform imports none of them)."""
    tp_mesh = mesh.get("tp")
    if tp_mesh is not None:
        from overdrive.transforms.tensor_parallel import (
            apply_tensor_parallel,
            match_blocks,
            plan_from_patterns,
        )

        plan = (plan_from_patterns(model, config.tp_plan, config.sequence_parallel, tp_mesh.size()) if config.tp_plan
                else match_blocks(model, tp_mesh.size(), config.sequence_parallel))
        apply_tensor_parallel(model, tp_mesh, plan)
    # Context parallel changes no module: attention is split while ``maybe_context_parallel`` is open.
    fsdp_mesh = mesh.fsdp_mesh()
    if not (config.activation_checkpointing or config.compile is not None or fsdp_mesh is not None):
        return model
    from overdrive.transforms.blocks import blocks_to_wrap

    blocks = blocks_to_wrap(model, list(config.block_names) or config.fsdp.transformer_cls_names_to_wrap)
    if config.activation_checkpointing:
        if not blocks:
            raise ValueError(f"activation_checkpointing found no blocks in {type(model).__name__}; name their "
                             "classes (ActivationCheckpointingKwargs(block_names=[...]) or "
                             "transformer_cls_names_to_wrap)")
        from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(blocks)
    if config.compile is not None:
        from overdrive.transforms.compile import apply_compile

        apply_compile(model, blocks, config.compile)
    if fsdp_mesh is not None:
        from overdrive.transforms import fully_shard as dp

        settings = dp.FullyShardSettings(
            reshard_after_forward=config.fsdp.reshard,
            mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision),
            root_mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision, root=True),
            offload_policy=dp.offload_policy(config.fsdp),
            wrap=dp.wrap_policy(config.fsdp, model, blocks),
            ignored_params=dp.ignored_parameters(config.fsdp, model))
        dp.apply_fully_shard(model, fsdp_mesh, settings)
    return model
