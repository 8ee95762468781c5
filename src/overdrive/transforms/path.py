"""The one model path: what ``prepare()`` does to a model, as named steps in one fixed order.

===========================  =========================================================================
step                         default (what a strategy that overrides nothing gets)
===========================  =========================================================================
``placement``                the model on the device (unless ``device_placement=False``); a model with
                             parameters on the meta device is refused by :func:`refuse_meta`, the one
                             refusal, which only placement steps call
``precision_hooks``          autocast around forward (filed in the ``HookRegistry``)
``fp8``                      fp8 conversion of the linear layers (with an fp8 recipe, after placement)
``parallelize``              tensor parallel (context parallel changes no module)
``activation_checkpointing`` checkpointing of the repeated blocks (``transforms/blocks.py``)
``compile``                  ``torch.compile`` in place: the whole model, or each block (regional)
``data_parallel``            nothing (one process); DDP's wrapper, FSDP2's ``fully_shard``
===========================  =========================================================================

A strategy changes a step by name (``StrategyBase.path_overrides``): an override is a function
``(path, model) -> model`` that may call the default (``path.placement(model)``, ``path.default(name)``,
...) before or after its own work, or :func:`skip` it. So compile and activation checkpointing mean the
same under every strategy, and what a strategy does differently is listed in one place per strategy.

A new transform joins the path with :func:`register_step` (``register_step("freeze", freeze,
after="activation_checkpointing")``, in the transform's own module): every strategy then runs it in that
place, and a strategy overrides it by name like a built-in step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from overdrive.config._frozen import FrozenValue
from overdrive.transforms.settings import ModelTransforms

if TYPE_CHECKING:
    from overdrive.precision.amp import AmpPrecision
    from overdrive.runtime.mesh import ParallelMesh
    from overdrive.transforms.hooks import HookRegistry

#: the model path's built-in steps, in the order they run (:func:`register_step` adds steps between them)
STEPS = ("placement", "precision_hooks", "fp8", "parallelize", "activation_checkpointing", "compile",
         "data_parallel")

#: a step added with :func:`register_step`, or a strategy's replacement for a step: ``(path, model) -> model``
PathStep = Callable[["ModelPath", nn.Module], nn.Module]

#: the steps added with :func:`register_step`, in the order they were added: name -> (step, the step it follows)
_ADDED: dict[str, tuple[PathStep, str]] = {}


def step_names() -> tuple[str, ...]:
    """The model path's steps in the order they run: each built-in step of :data:`STEPS`, then the steps
    registered right after it (in the order they were registered, each followed by its own)."""
    order: list[str] = []

    def emit(name: str) -> None:
        order.append(name)
        for added, (_, after) in _ADDED.items():
            if after == name:
                emit(added)

    for name in STEPS:
        emit(name)
    return tuple(order)


def register_step(name: str, step: PathStep, *, after: str) -> None:
    """Add ``step`` (``(path, model) -> model``, in place) to the model path of every strategy, run right after
    the step called ``after``. Each ``prepare()`` of a model runs it there, as it runs the built-in steps; a
    strategy replaces it by name in its ``path_overrides``. Registering a name again replaces its step and
    place. The built-in steps keep their names: a strategy overrides them, nothing replaces them for all."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a model path step's name is an identifier (letters, digits, _); got {name!r}")
    if name in STEPS:
        raise ValueError(f"{name!r} is a built-in step of the model path: a strategy replaces it in its "
                         "path_overrides; register the transform under its own name")
    if not callable(step):
        raise TypeError(f"a model path step is a function (path, model) -> model; got {step!r} for {name!r}")
    previous = _ADDED.pop(name, None)
    names = step_names()
    if after not in names:
        if previous is not None:
            _ADDED[name] = previous
        raise ValueError(f"the model path has no step {after!r} for {name!r} to run after; its steps: "
                         f"{', '.join(names)}")
    _ADDED[name] = (step, after)


def remove_step(name: str) -> None:
    """Take the step ``name`` added with :func:`register_step` out of the model path (the paths built from
    now on)."""
    if name not in _ADDED:
        raise ValueError(f"no step {name!r} was added with register_step; added: {', '.join(_ADDED) or 'none'}")
    followers = [added for added, (_, after) in _ADDED.items() if after == name]
    if followers:
        raise ValueError(f"cannot remove the model path step {name!r}: {', '.join(followers)} run after it; "
                         "remove them first")
    del _ADDED[name]


#: parameters fp8 conversion replaced: ``id(old) -> (weakref(old), new)``
Replaced = dict[int, tuple[weakref.ref, nn.Parameter]]


def skip(path: ModelPath, model: nn.Module) -> nn.Module:
    """An override that leaves a step out (e.g. DeepSpeed's engine places the model and runs its precision)."""
    return model


def refuse_meta(model: nn.Module, remedy: str = "") -> None:
    """Fail if ``model`` has parameters on the meta device: there are no weights to train."""
    on_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if on_meta:
        shown = ", ".join(on_meta[:5]) + (", ..." if len(on_meta) > 5 else "")
        raise ValueError(
            f"prepare() got a model with {len(on_meta)} parameters on the meta device ({shown}); materialise it "
            f"first (model.to_empty(device=...) then load its weights){remedy}")


class PathContext(FrozenValue):
    """The runtime objects the model path works with (``StrategyContext`` extends it)."""

    device: torch.device
    mesh: ParallelMesh
    #: the Accelerator's autocast hooks and loss scaler
    precision: AmpPrecision
    #: the model path's settings, the same for every strategy
    transforms: ModelTransforms
    #: where the hooks put on prepared models are filed, so unwrap_model / free_memory remove them
    hooks: HookRegistry
    #: parameters fp8 conversion replaced (``id(old) -> (weakref(old), new)``), for ``prepare_optimizer``
    fp8_replaced: Replaced

    def __init__(self, *, device: torch.device, mesh: ParallelMesh, precision: AmpPrecision,
                 transforms: ModelTransforms, hooks: HookRegistry, fp8_replaced: Replaced | None = None) -> None:
        fp8_replaced = {} if fp8_replaced is None else fp8_replaced
        self._init(locals())


class ModelPath:
    """The model path for one ``prepare`` of one model (see the module): the default steps as methods,
    the strategy's overrides by name, and what the steps share (the parameters fp8 replaced, the blocks)."""

    def __init__(self, context: PathContext, *, device_placement: bool = True, evaluation_mode: bool = False,
                 meta_remedy: str = "", overrides: Mapping[str, PathStep] | None = None) -> None:
        self.context = context
        self.mesh, self.transforms, self.device = context.mesh, context.transforms, context.device
        self.precision, self.hooks = context.precision, context.hooks
        #: whether ``placement`` moves the model (``prepare(device_placement=...)``)
        self.device_placement = device_placement
        #: ``prepare_model(evaluation_mode=True)``: a data-parallel wrapper that only serves training is left out
        self.evaluation_mode = evaluation_mode
        #: what the remedy of a refused meta model adds (FSDP2: its rank-0 loading)
        self.meta_remedy = meta_remedy
        #: the parameters fp8 conversion replaced in this run (also added to the context's ``fp8_replaced``)
        self.replaced: Replaced = {}
        self._blocks: list[nn.Module] | None = None
        #: the steps of this path, in the order they run (the built-ins and the registered ones, as they are now)
        self.names = step_names()
        self._defaults: dict[str, Callable[[nn.Module], nn.Module]] = {
            "placement": self.placement, "precision_hooks": self.precision_hooks, "fp8": self.fp8,
            "parallelize": self.parallelize, "activation_checkpointing": self.activation_checkpointing,
            "compile": self.compile, "data_parallel": self.data_parallel}
        for name, (step, _) in _ADDED.items():
            self._defaults[name] = self._bind(step)
        self.overrides: dict[str, PathStep] = {}
        for name, step in (overrides or {}).items():
            self.override(name, step)

    def override(self, name: str, step: PathStep) -> None:
        """Run ``step`` instead of the step called ``name`` (one of :attr:`names`)."""
        self._check(name)
        self.overrides[name] = step

    def step(self, name: str) -> Callable[[nn.Module], nn.Module]:
        """The step called ``name`` as it runs in this path: the override if there is one, else the default."""
        self._check(name)
        override = self.overrides.get(name)
        return self._defaults[name] if override is None else self._bind(override)

    def default(self, name: str) -> Callable[[nn.Module], nn.Module]:
        """The step called ``name`` as it runs when no strategy overrides it (an override may call it)."""
        self._check(name)
        return self._defaults[name]

    def run(self, model: nn.Module) -> nn.Module:
        """Every step in order; return what trains (``model`` itself unless ``data_parallel`` wraps it)."""
        for name in self.names:
            model = self.step(name)(model)
        return model

    def _check(self, name: str) -> None:
        if name not in self.names:
            raise ValueError(f"the model path has no step {name!r}; its steps: {', '.join(self.names)}")

    def _bind(self, step: PathStep) -> Callable[[nn.Module], nn.Module]:
        return lambda model: step(self, model)

    # -- the default steps -----------------------------------------------------------------------------
    def placement(self, model: nn.Module) -> nn.Module:
        """``model`` on the device (refused if it is on the meta device); as it is without device placement."""
        return self.move(model) if self.device_placement else model

    def precision_hooks(self, model: nn.Module) -> nn.Module:
        """Autocast around ``model``'s forward (floating outputs back in fp32), filed in the hook registry."""
        self.hooks.add(self.precision.attach(model))
        return model

    def fp8(self, model: nn.Module) -> nn.Module:
        """With an fp8 recipe and device placement: the linear layers converted (torchao's float8 weights
        cannot be on the meta device); the parameters replaced are recorded for the optimizers."""
        if self.transforms.fp8 is None or not self.device_placement:
            return model
        from overdrive.precision.fp8 import apply_fp8

        self.replaced = apply_fp8(model, self.transforms.fp8)
        self.context.fp8_replaced.update(self.replaced)
        return model

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Tensor parallel over the mesh's ``tp`` axis (from the plan's ``tp_plan``, else the matched blocks);
        context parallel changes no module (attention is split while ``maybe_context_parallel`` is open)."""
        tp_mesh = self.mesh.get("tp")
        if tp_mesh is None:
            return model
        from overdrive.transforms.tensor_parallel import (
            apply_tensor_parallel,
            match_blocks,
            plan_from_patterns,
        )

        config = self.transforms
        plan = (plan_from_patterns(model, config.tp_plan, config.sequence_parallel, tp_mesh.size()) if config.tp_plan
                else match_blocks(model, tp_mesh.size(), config.sequence_parallel))
        apply_tensor_parallel(model, tp_mesh, plan)
        return model

    def activation_checkpointing(self, model: nn.Module) -> nn.Module:
        """Checkpoint each of the model's blocks (an error names the remedy when there are none)."""
        if not self.transforms.activation_checkpointing:
            return model
        blocks = self.blocks(model)
        if not blocks:
            raise ValueError(f"activation_checkpointing found no blocks in {type(model).__name__}; name their "
                             "classes (ActivationCheckpointingKwargs(block_names=[...]) or "
                             "transformer_cls_names_to_wrap)")
        from overdrive.transforms.activation_checkpointing import apply_activation_checkpointing

        apply_activation_checkpointing(blocks)
        return model

    def compile(self, model: nn.Module) -> nn.Module:
        """Compile in place, the whole model or each block (``CompileSettings.regional``)."""
        if self.transforms.compile is None:
            return model
        from overdrive.transforms.compile import apply_compile

        apply_compile(model, self.blocks(model), self.transforms.compile)
        return model

    def data_parallel(self, model: nn.Module) -> nn.Module:
        """``model`` as it is: one process has nothing to replicate (DDP and FSDP2 override this step)."""
        return model

    # -- what the steps and their overrides share ------------------------------------------------------
    def move(self, model: nn.Module) -> nn.Module:
        """``model`` on the device; a model on the meta device is refused first (:func:`refuse_meta`)."""
        refuse_meta(model, self.meta_remedy)
        return model.to(self.device)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The blocks that activation checkpointing, regional compile and ``fully_shard`` work on (found once
        per run, after tensor parallel: the plan's ``block_names``, else FSDP's wrap names, else the
        repeated blocks)."""
        if self._blocks is None:
            from overdrive.transforms.blocks import blocks_to_wrap

            config = self.transforms
            self._blocks = blocks_to_wrap(model, list(config.block_names) or config.fsdp.transformer_cls_names_to_wrap)
        return self._blocks

    def fully_shard(self, model: nn.Module) -> nn.Module:
        """FSDP2's ``fully_shard`` over the mesh's data-parallel shard axes (nothing without one), with the
        plan's precision, offload and wrap policy."""
        fsdp_mesh = self.mesh.fsdp_mesh()
        if fsdp_mesh is None:
            return model
        from overdrive.transforms import fully_shard as dp

        config = self.transforms
        settings = dp.FullyShardSettings(
            reshard_after_forward=config.fsdp.reshard,
            mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision),
            root_mp_policy=dp.mixed_precision_policy(config.fsdp, config.precision, root=True),
            offload_policy=dp.offload_policy(config.fsdp),
            wrap=dp.wrap_policy(config.fsdp, model, self.blocks(model)),
            ignored_params=dp.ignored_parameters(config.fsdp, model))
        dp.apply_fully_shard(model, fsdp_mesh, settings)
        return model
