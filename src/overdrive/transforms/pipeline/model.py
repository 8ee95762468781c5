"""Pipeline parallelism as a model transform: ``apply_pipeline`` cuts a model into stages, wraps each
local stage for data / tensor parallelism, and returns a ``PipelinedModel`` whose forward runs one whole
schedule step of ``torch.distributed.pipelining``.

The user's loop stays as it is. ``outputs = model(**batch)`` (the target under ``labels``) runs forward
*and* backward over the micro-batches, with the loss divided by the micro-batch count and by the
accumulation window, and returns ``outputs.loss`` (the micro-batch mean, on every rank) and
``outputs.logits`` (on the rank holding the last stage; an empty tensor of the same trailing shape on the
others, so ``gather_for_metrics`` counts each sample once). ``outputs.loss.backward()`` (what
``accelerator.backward`` calls) finds the work done: the loss's autograd node has nothing left to do.
In ``model.eval()`` or under ``torch.no_grad()`` the forward runs the schedule forward only.

Each stage is a :class:`StageModule`: a view that shares the stage model's children, parameters and buffers
(so parameter names, tensor-parallel plans and checkpoints are the same as without a pipeline) and runs
the stage model's own ``forward``. Two hooks make a stage out of the whole forward: the stage's first
block takes the previous stage's activations in place of its input, and the stage stops with its last
block's output.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.microbatch import TensorChunkSpec
from torch.distributed.pipelining.schedules import get_schedule_class

from overdrive.runtime import group
from overdrive.runtime.torch_private import (
    pipeline_computation_type,
    pipeline_replicate,
    tree_flatten,
    tree_map,
)
from overdrive.transforms.pipeline import schedule as schedules
from overdrive.transforms.pipeline.schedule import PipelineRuntime
from overdrive.transforms.pipeline.split import (
    StageLayout,
    build_stage_model,
    plan_stages,
    shallow_copy,
    stage_blocks,
)
from overdrive.transforms.pipeline.ties import find_tied_parameters, place_ties, summed_tied_gradients

#: the one keyword the model's inputs travel under through torch's schedule (split per micro-batch)
INPUTS = "overdrive_pipeline_inputs"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEADER = 12


class PipelineOutput(dict):
    """The prepared model's output: ``loss`` (the micro-batch mean, on every pipeline rank) and ``logits``;
    readable as attributes or keys, like a ``transformers`` model output."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _BackwardAlreadyRun(torch.autograd.Function):
    """The loss of a pipeline step: its gradients were computed inside the schedule, so backward through
    it has nothing left to do (``accelerator.backward(loss)`` and ``loss.backward()`` both work)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.clone()

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[None, None]:
        return None, None


class _StageOutput(BaseException):
    """Raised by a stage's last block to end the stage model's forward there (a BaseException, so the
    model's own ``except Exception`` clauses let it through)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class StageModule(nn.Module):
    """One pipeline stage as ``torch.distributed.pipelining.PipelineStage`` runs it.

    It shares ``stage_model``'s children, parameters and buffers (same names) and calls ``stage_model``
    with the batch (``INPUTS``) while the hooks feed the received activations to the first block and stop
    after the last one. The last stage returns ``(logits,)``, or ``(logits, loss)`` when the model computes
    its own loss.
    """

    # set through __dict__ (not children): declared so that they are modules, not nn.Module.__getattr__'s union
    stage_model: nn.Module
    _first_block: nn.Module
    _last_block: nn.Module

    def __init__(self, stage_model: nn.Module, layout: StageLayout, stage: int, call: dict[str, Any]) -> None:
        super().__init__()
        for key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            self.__dict__[key] = stage_model.__dict__[key]
        self.__dict__["stage_model"] = stage_model  # not a child: its children are ours
        self._no_split_modules = getattr(stage_model, "_no_split_modules", None)
        self.stage = stage
        self.is_first, self.is_last = stage == 0, stage == layout.num_stages - 1
        self._call = call  # settings of the current step, shared with the PipelinedModel
        # plain attributes (not children): the children registry is the stage model's
        self.__dict__["_first_block"], self.__dict__["_last_block"] = stage_blocks(stage_model, layout, stage)
        self._active = False
        self._incoming: torch.Tensor | None = None

    def install_hooks(self) -> None:
        """Hook the first and last block; call after the data-parallel wrapping, so that these hooks run
        before FSDP's pre-forward (input) and after its post-forward (output)."""
        if not self.is_first:
            self._first_block.register_forward_pre_hook(self._take_input, prepend=True, with_kwargs=True)
        if not self.is_last:
            self._last_block.register_forward_hook(self._stop)

    def _take_input(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not self._active or self._incoming is None:
            return None
        hidden, self._incoming = self._incoming, None
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, _first_parameter(module): hidden}

    def _stop(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._active:
            raise _StageOutput(output[0] if isinstance(output, (tuple, list)) else output)

    def forward(self, *received: torch.Tensor, **inputs: Any) -> Any:
        args, kwargs = inputs[INPUTS]
        self._incoming = received[0] if received else None
        self._active = True
        try:
            output = self.stage_model(*args, **kwargs)
        except _StageOutput as stop:
            output, stopped = stop.value, True
        else:
            stopped = False
        finally:
            self._active = False
            unused, self._incoming = self._incoming, None
        if unused is not None:
            raise RuntimeError(f"pipeline stage {self.stage}: the model's forward never called the stage's first "
                               f"block ({type(self._first_block).__name__}); give split points that follow the "
                               "order in which forward calls the blocks")
        if not stopped and not self.is_last:
            raise RuntimeError(f"pipeline stage {self.stage}: the model's forward returned without calling the "
                               f"stage's last block ({type(self._last_block).__name__})")
        return output if stopped else self._last_output(output)

    def _last_output(self, output: Any) -> tuple[torch.Tensor, ...]:
        logits = _primary(output)
        if not self._call.get("model_loss"):
            return (logits,)
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if loss is None:
            raise ValueError(f"{type(self.stage_model).__name__} returned no loss for the labels given; give the "
                             "loss function once, as PipelineConfig(loss_fn=...), and pass the target as labels=")
        return logits, loss.reshape(1)


def _first_parameter(module: nn.Module) -> str:
    forward = getattr(type(module), "forward", None)
    names = list(inspect.signature(forward).parameters)[1:] if forward is not None else []
    return names[0] if names else "hidden_states"


def _primary(output: Any) -> torch.Tensor:
    """The logits of a model output: a tensor, the ``logits`` of a mapping, else its first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if output.get("logits") is not None:
            return output["logits"]
        output = list(output.values())
    for item in output if isinstance(output, (tuple, list)) else ():
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError(f"the last pipeline stage returned {type(output).__name__}, which holds no tensor to use as "
                    "logits")


class PipelinedModel(nn.Module):
    """The prepared model: a view of this rank's stages under the original parameter names, whose forward
    runs one schedule step. See the module docstring."""

    #: each rank holds its own stages, which Accelerate's checkpoint files (the main process writes the whole
    #: model) cannot hold: save_state writes the resharding layout (Accelerate trains no pipeline)
    checkpoint_layout = "resharding"

    def __init__(self, stages: list[StageModule], wrapped: list[nn.Module], settings: PipelineRuntime) -> None:
        super().__init__()
        view = merged_view([s.stage_model for s in stages])
        for key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            self.__dict__[key] = view.__dict__[key]
        self.stage_modules, self.wrapped = stages, wrapped
        self.settings = settings
        self._anchor = torch.zeros((), requires_grad=True)
        self._schedules: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._call = stages[0]._call
        self._losses: list[torch.Tensor] = []

    # -- modes -------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> PipelinedModel:
        super().train(mode)
        for stage in self.stage_modules:
            stage.training = mode
            stage.stage_model.train(mode)
        for module in self.wrapped:
            module.training = mode
        return self

    @property
    def stage_models(self) -> list[nn.Module]:
        """The stage modules this rank runs, in stage order."""
        return [s.stage_model for s in self.stage_modules]

    # -- one step ----------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> PipelineOutput:
        s = self.settings
        labels = kwargs.get("labels")
        if s.loss_fn is not None:  # the target goes to the loss function, not to the model
            kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
        train = self.training and torch.is_grad_enabled()
        batch = self._check(args, kwargs, labels, train)
        self._call.update(model_loss=s.loss_fn is None and labels is not None, has_target=labels is not None,
                          scale=1.0 / (s.num_microbatches * max(1, s.window.divisor if s.window is not None else 1)))
        target = labels if labels is not None else torch.zeros(batch, device=s.device)
        return self._result(self._run(args, kwargs, target, train), train, labels is not None)

    def _check(self, args: tuple, kwargs: dict, labels: Any, train: bool) -> int:
        """The batch size, once the step is known to be possible (checked before any communication)."""
        if train and labels is None:
            raise ValueError("a pipelined model computes the loss inside the pipeline: pass the target as labels= "
                             "(outputs = model(inputs, labels=targets)), with the loss function given once as "
                             "PipelineConfig(loss_fn=...) unless the model computes its own loss from labels")
        batch = _batch_size((args, kwargs, labels))
        n = self.settings.num_microbatches
        if batch % n:
            raise ValueError(f"a batch of {batch} samples per data-parallel rank cannot be split into "
                             f"num_microbatches={n} equal micro-batches; make the per-process batch size a multiple "
                             f"of {n} (drop_last=True avoids a short last batch)")
        return batch

    def _run(self, args: tuple, kwargs: dict, target: torch.Tensor, train: bool) -> Any:
        """One schedule step (forward and backward, or forward only); the merged outputs on the last stage."""
        schedule, fresh = self._schedule_for(args, kwargs, train)
        self._losses = []
        with self._keep_grads(fresh), contextlib.ExitStack() as stack:
            for module in self.wrapped:
                stack.enter_context(self.settings.no_sync(module))
            if train and self.settings.ties:
                stack.enter_context(summed_tied_gradients(self, self.settings.ties, self.settings.pp_rank))
            run = schedule.step if train else schedule.eval
            return run(target=target, **{INPUTS: (args, kwargs)})

    def _loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        parts = output if isinstance(output, (tuple, list)) else [output]
        loss_fn = self.settings.loss_fn
        if self._call["model_loss"]:
            value = parts[1].reshape(())
        elif self._call["has_target"]:
            assert loss_fn is not None  # without a loss function, a target makes model_loss True
            value = loss_fn(parts[0], target)
        else:  # evaluation without labels: torch's schedule still calls the loss function
            value = parts[0].float().sum() * 0.0
        self._losses.append(value.detach())
        return value * self._call["scale"]

    def _schedule_for(self, args: tuple, kwargs: dict, train: bool) -> tuple[Any, bool]:
        """The schedule for training or evaluation on inputs of this structure and shape (torch's stages fix
        their buffers' shapes at their first step), and whether it is new (its first step initialises it).
        Training and evaluation have their own stages, so switching between them initialises nothing."""
        leaves, spec = tree_flatten((args, kwargs))
        key = (train, str(spec), tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t)
                                       for t in leaves))
        schedule = self._schedules.get(key)
        fresh = schedule is None
        if fresh:
            schedule = self._schedules[key] = _build_schedule(self, args, kwargs, train)
            while len(self._schedules) > self.settings.max_cached_shapes:
                self._schedules.popitem(last=False)
        self._schedules.move_to_end(key)
        return schedule, fresh

    @contextlib.contextmanager
    def _keep_grads(self, active: bool) -> Iterator[None]:
        """torch's first step of a schedule runs a metadata pass that clears FSDP gradients: keep the ones
        accumulated so far (a new input shape in the middle of an accumulation window) and add them back."""
        saved = {p: p.grad for p in self.parameters() if p.grad is not None} if active else {}
        for p in saved:
            p.grad = None
        try:
            yield
        finally:
            for p, grad in saved.items():
                p.grad = grad if p.grad is None else p.grad + grad

    def _result(self, merged: Any, train: bool, has_labels: bool) -> PipelineOutput:
        s = self.settings
        header = torch.zeros(_HEADER, dtype=torch.float64, device=s.device)
        logits = None
        if merged is not None:
            logits = merged[0] if isinstance(merged, (tuple, list)) else merged
            if has_labels:
                header[0] = torch.stack(self._losses[-s.num_microbatches:]).float().mean()
            header[1:3] = torch.tensor([logits.ndim, _DTYPES.index(logits.dtype)])
            header[3:3 + logits.ndim] = torch.tensor(logits.shape, dtype=torch.float64)
        if s.pp_group is not None:
            dist.broadcast(header, group=s.pp_group, group_src=s.last_stage_rank)
        if logits is None:
            ndim, dtype = int(header[1]), _DTYPES[int(header[2])]
            shape = [0, *(int(x) for x in header[4:3 + ndim])]
            logits = torch.empty(shape, dtype=dtype, device=s.device)
        loss = header[0].float() if has_labels else None
        if loss is not None and train:
            loss = _BackwardAlreadyRun.apply(self._anchor, loss)
        return PipelineOutput(loss=loss, logits=logits)

    # -- whole-model views -------------------------------------------------------------------------
    def gather_full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every stage's full weights on the CPU, gathered on global rank 0 (empty elsewhere); a collective."""
        local: dict[str, torch.Tensor] = {}
        for stage in self.stage_modules:
            state = get_model_state_dict(stage, options=StateDictOptions(full_state_dict=True))
            # torch types state dict values as any ValueType; a model's are tensors
            local.update({k: cast(torch.Tensor, v).detach().cpu() for k, v in state.items()})
        if not dist.is_initialized():
            return local
        parts: list[Any] = [None] * group.world_size() if group.rank() == 0 else []
        dist.gather_object(local if self.settings.speaks_for_stage else {}, parts if parts else None, dst=0)
        return {k: v for part in parts for k, v in part.items()} if group.rank() == 0 else {}


def _batch_size(tree: Any) -> int:
    leaves, _ = tree_flatten(tree)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.ndim:
            return leaf.shape[0]
    raise ValueError("a pipelined model needs a tensor input with a batch dimension to split into micro-batches")


def _build_schedule(model: PipelinedModel, args: tuple, kwargs: dict, train: bool) -> Any:
    s = model.settings
    batch = _batch_size((args, kwargs))
    chunk = {INPUTS: tree_map(lambda t: TensorChunkSpec(0) if isinstance(t, torch.Tensor) and t.ndim and
                              t.shape[0] == batch else pipeline_replicate(), (args, kwargs))}
    stages = [PipelineStage(w, st.stage, s.num_stages, s.device, group=s.pp_group)
              for w, st in zip(model.wrapped, model.stage_modules)]
    # torch runs the backward actions of a multi-stage schedule's list in evaluation too, which fails for
    # DualPipeV's overlapped actions: evaluation of V-shaped layouts runs ZBV's list with no-op backwards.
    name = "ZBVZeroBubble" if not train and s.schedule in schedules.V_SHAPED else s.schedule
    schedule = get_schedule_class(name)(stages[0] if s.schedule in schedules.SINGLE else stages,
                                        s.num_microbatches, loss_fn=model._loss, scale_grads=False)
    if not train and hasattr(schedule, "register_custom_function"):
        for kind in ("FULL_BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "REDUCE_GRAD"):
            schedule.register_custom_function(pipeline_computation_type(kind), _skip_backward)
    # Tensors without the batch dimension (a (1, seq) position tensor) are given whole to every micro-batch.
    # Set after construction: LoopedBFS does not take the argument, and the base class keeps it here.
    schedule._kwargs_chunk_spec = chunk
    return schedule


def _skip_backward(action: Any, ctx: Any) -> None:
    """A backward action of an evaluation step: nothing to compute; forget its (empty) gradient receive."""
    ctx.schedule_ref.bwd_recv_ops.pop((action.stage_index, action.microbatch_index), None)


def merged_view(models: list[nn.Module]) -> nn.Module:
    """One module tree naming every parameter of ``models`` (stages of one model on this rank) by its
    original name: where the stages differ, the module that holds parameters wins."""
    first = models[0]
    if all(m is first for m in models):
        return first
    holders = [m for m in models if any(True for _ in m.parameters())]
    if len({id(m) for m in holders}) <= 1:
        return holders[0] if holders else first
    view = shallow_copy(first)
    own = [m for m in holders if any(True for _ in m.parameters(recurse=False))]
    if own:
        view.__dict__["_parameters"] = own[0]._parameters
    names = list(dict.fromkeys(n for m in models for n in m._modules))
    for name in names:
        view._modules[name] = merged_view([child for m in models if (child := m._modules.get(name)) is not None])
    return view


def apply_pipeline(model: nn.Module, settings: PipelineRuntime,
                   wrap_stage: Callable[[nn.Module], nn.Module]) -> PipelinedModel:
    """Cut ``model`` into ``settings.num_stages`` stages, build this rank's stages, wrap each with
    ``wrap_stage`` (data / tensor parallel, precision) and return the ``PipelinedModel``."""
    layout = plan_stages(model, settings.num_stages, settings.split_points, settings.balance)
    settings.layout = layout
    settings.ties = find_tied_parameters(model, layout)
    if settings.ties:
        place_ties(settings.ties, settings.pp_size, settings.style, settings.num_stages, settings.mesh)
    call: dict[str, Any] = {}
    stages = [StageModule(build_stage_model(model, layout, s), layout, s, call) for s in settings.local_stages]
    wrapped = [wrap_stage(stage) for stage in stages]
    for stage in stages:
        stage.install_hooks()
    return PipelinedModel(stages, wrapped, settings)
