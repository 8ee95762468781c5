"""Tensor parallel for any model: a plan (module name -> style), found by structure or given by the user.

A *plan* maps module names to styles: ``"colwise"`` (output features split across the tensor-parallel
group), ``"rowwise"`` (input features split, outputs summed), ``"colwise_rep"`` (colwise, output gathered),
``"sequence_parallel"`` (norms and dropouts run on a slice of the sequence) and ``"replicate"`` (left whole
on every rank). Without a user plan, :func:`match_blocks` finds the repeated blocks of the model and, in
each, the projections that read the block's hidden size and the one that writes it back:
attention (q/k/v -> o) and MLP (up/gate -> down) come out as colwise -> rowwise pairs, whatever the
classes or attribute names are (GPT-2, Llama, BERT and hand-written blocks alike). Heads are divided
between ranks by sharding, and head-count attributes on attention modules are divided to match.

Fused projections (GPT-2's ``c_attn`` holding q, k and v side by side, fused gate/up) cannot be split
column-wise without reordering their weight (rank r would get all of q and part of k): the built-in
plan keeps them replicated with a notice, and a user plan that asks to split one gets an error.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from overdrive.config.choices import invalid_choice
from overdrive.transforms.blocks import find_blocks

logger = logging.getLogger(__name__)

STYLES = ("colwise", "rowwise", "colwise_rep", "sequence_parallel", "replicate")
#: integer attributes of an attention module that count heads (or head-sized widths) per rank
HEAD_ATTRIBUTES = ("num_heads", "num_attention_heads", "num_key_value_heads", "n_head", "n_heads",
                   "n_kv_heads", "num_kv_heads", "all_head_size", "inner_dim")
HEAD_DIM_ATTRIBUTES = ("head_dim", "attention_head_size", "head_size", "d_head")


@dataclass
class TensorParallelPlan:
    """What :func:`apply_tensor_parallel` does to a model: a style per module name, the attention modules
    whose head counts are divided, and the blocks that bound the sequence-parallel region."""

    styles: dict[str, str] = field(default_factory=dict)
    attention: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    sequence_parallel: bool = False
    notes: list[str] = field(default_factory=list)


# -- what a module is, by structure -----------------------------------------------------------------
def is_conv1d(module: nn.Module) -> bool:
    """A transposed linear layer (transformers' ``Conv1D``: weight ``(in, out)``, ``y = x @ W + b``)."""
    weight = getattr(module, "weight", None)
    return (not isinstance(module, nn.Linear) and isinstance(getattr(module, "nf", None), int)
            and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.shape[1] == module.nf)


def is_projection(module: nn.Module) -> bool:
    """Whether ``module`` is a projection tensor parallel can split (a Linear, or GPT-2's Conv1D)."""
    return isinstance(module, nn.Linear) or is_conv1d(module)


def projection_dims(module: nn.Module) -> tuple[int, int]:
    """(in features, out features) of a Linear or Conv1D."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = module.get_parameter("weight")
    return int(weight.shape[0]), int(weight.shape[1])


def is_norm(module: nn.Module, hidden: int) -> bool:
    """A norm over the hidden size: a leaf whose only parameters are a weight (and bias) of size ``hidden``."""
    if next(module.children(), None) is not None or is_projection(module) or isinstance(module, nn.Embedding):
        return False
    params = dict(module.named_parameters(recurse=False))
    return "weight" in params and set(params) <= {"weight", "bias"} and all(
        tuple(p.shape) == (hidden,) for p in params.values())


# -- the structural matcher -------------------------------------------------------------------------
@dataclass
class _Stage:
    inputs: list[tuple[str, nn.Module]]
    output: tuple[str, nn.Module]
    fused: bool

    @property
    def kind(self) -> str:
        return "attention" if len(self.inputs) >= 3 or (self.fused and self._ratio() == 3) else "mlp"

    def _ratio(self) -> int:
        return projection_dims(self.inputs[0][1])[1] // max(projection_dims(self.output[1])[0], 1)


def _group(name: str) -> str:
    return name.split(".", 1)[0]


def _stages(block: nn.Module) -> tuple[list[_Stage], list[str]]:
    """Split a block's projections into stages: projections reading the hidden size, closed by the last
    projection of a child module that writes the hidden size back. Returns the stages and the names of
    projections in no stage."""
    leaves = [(n, m) for n, m in block.named_modules() if n and is_projection(m)]
    if not leaves:
        return [], []
    hidden = projection_dims(leaves[0][1])[0]
    stages: list[_Stage] = []
    pending: list[tuple[str, nn.Module]] = []
    loose: list[str] = []
    for i, (name, module) in enumerate(leaves):
        d_in, d_out = projection_dims(module)
        closes_group = i == len(leaves) - 1 or _group(leaves[i + 1][0]) != _group(name)
        feeds = [projection_dims(m)[1] for _, m in pending]
        if pending and closes_group and d_out == hidden and (d_in in feeds or (
                len(pending) == 1 and feeds[0] % d_in == 0 and feeds[0] > d_in)):
            stages.append(_Stage(list(pending), (name, module), fused=d_in not in feeds))
            pending = []
        elif d_in == hidden:
            pending.append((name, module))
        else:
            loose += [n for n, _ in pending] + [name]
            pending = []
    loose += [n for n, _ in pending]
    return stages, loose


def _common_parent(names: list[str]) -> str:
    parts = [n.split(".")[:-1] for n in names]
    common: list[str] = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return ".".join(common)


def _head_dim(module: nn.Module) -> int | None:
    for name in HEAD_DIM_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def match_blocks(model: nn.Module, tp_size: int, sequence_parallel: bool = False) -> TensorParallelPlan:
    """The built-in plan for ``model``, found from the structure of its repeated blocks.

    Raises ValueError naming the unmatched modules when no block has an attention or MLP shape, and
    when heads or widths do not divide by ``tp_size``."""
    blocks = find_blocks(model) or [("", model)]
    plan = TensorParallelPlan(blocks=[name for name, _ in blocks], sequence_parallel=sequence_parallel)
    problems: list[str] = []
    unmatched: list[str] = []
    for block_name, block in blocks:
        prefix = f"{block_name}." if block_name else ""
        stages, loose = _stages(block)
        unmatched += [prefix + n for n in loose]
        for stage in stages:
            _plan_stage(plan, stage, prefix, block, tp_size, problems)
        if sequence_parallel:
            _plan_sequence_parallel(plan, block, prefix, stages, problems)
    if not any(style in ("colwise", "rowwise") for style in plan.styles.values()):
        shown = unmatched or [n for n, m in model.named_modules() if is_projection(m)] or ["(no Linear layers)"]
        raise ValueError(
            f"no tensor-parallel plan fits {type(model).__name__}: no block has an attention (q/k/v -> o) or "
            f"MLP (up/gate -> down) shape. Unmatched modules: {', '.join(shown[:12])}"
            f"{', ...' if len(shown) > 12 else ''}. Give a plan: TorchTensorParallelPlugin(tp_plan="
            "{'layers.*.mlp.up': 'colwise', 'layers.*.mlp.down': 'rowwise', ...})")
    if problems:
        raise ValueError("tensor parallel cannot split this model:\n  - " + "\n  - ".join(problems))
    if unmatched:
        plan.notes.append(f"kept replicated (no attention/MLP shape): {', '.join(unmatched[:6])}"
                          f"{', ...' if len(unmatched) > 6 else ''}")
    return plan


def _plan_stage(plan: TensorParallelPlan, stage: _Stage, prefix: str, block: nn.Module, tp_size: int,
                problems: list[str]) -> None:
    names = [prefix + n for n, _ in stage.inputs] + [prefix + stage.output[0]]
    if stage.fused:
        for name in names:
            plan.styles[name] = "replicate"
        note = (f"kept replicated: fused {stage.kind} projections such as {names[0]} "
                f"({projection_dims(stage.inputs[0][1])[1]} outputs feeding {projection_dims(stage.output[1])[0]} "
                "inputs): splitting one column-wise would mix q/k/v (or gate/up) across ranks")
        if not any(n.startswith("kept replicated: fused") for n in plan.notes):
            plan.notes.append(note)
        return
    parent_name = _common_parent([n for n, _ in stage.inputs])
    parent = block.get_submodule(parent_name) if parent_name else block
    head_dim = _head_dim(parent) if stage.kind == "attention" else None
    for name, module in stage.inputs:
        width = projection_dims(module)[1]
        unit = head_dim or 1
        if width % (unit * tp_size):
            what = f"{width // unit} heads of size {unit}" if head_dim else f"{width} output features"
            problems.append(f"{prefix}{name} has {what}, which do not divide by tp_size={tp_size}")
        plan.styles[prefix + name] = "colwise"
    plan.styles[prefix + stage.output[0]] = "rowwise"
    if stage.kind == "attention":
        plan.attention.append(prefix + parent_name if parent_name else prefix.rstrip("."))


def _plan_sequence_parallel(plan: TensorParallelPlan, block: nn.Module, prefix: str, stages: list[_Stage],
                            problems: list[str]) -> None:
    if any(stage.fused for stage in stages):
        problems.append(f"sequence_parallel: block {prefix.rstrip('.') or '(root)'} has a fused projection kept "
                        "replicated, which cannot take a sequence-sharded input; turn sequence_parallel off")
        return
    first = next((m for _, m in block.named_modules() if is_projection(m)), None)
    if first is None:
        return
    hidden = projection_dims(first)[0]
    closers = {name for name in (s.output[0] for s in stages)}
    for name, module in block.named_modules():
        if name and is_norm(module, hidden):
            plan.styles[prefix + name] = "sequence_parallel"
    # Dropouts that act on the residual stream: those beside a closing projection, registered after it.
    for closer in closers:
        parent_name = closer.rsplit(".", 1)[0] if "." in closer else ""
        parent = block.get_submodule(parent_name) if parent_name else block
        seen_closer = False
        for child_name, child in parent.named_children():
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            seen_closer = seen_closer or full == closer
            if seen_closer and isinstance(child, nn.Dropout):
                plan.styles[prefix + full] = "sequence_parallel"


# -- user plans ---------------------------------------------------------------------------------------
def _pattern(text: str) -> re.Pattern:
    """``*`` stands for one name component; ``re:`` starts a regular expression."""
    if text.startswith("re:"):
        return re.compile(text[3:])
    return re.compile(fnmatch.translate(text).replace(".*", "[^.]*"))


def plan_from_patterns(model: nn.Module, patterns: dict[str, str], sequence_parallel: bool = False,
                       tp_size: int = 1) -> TensorParallelPlan:
    """The plan for a user's ``{module-name pattern: style}``; every pattern must match a module."""
    problems = [invalid_choice(f"tp_plan[{k!r}] = {v!r}", v, STYLES)
                for k, v in patterns.items() if v not in STYLES]
    compiled = [(text, _pattern(text), style) for text, style in patterns.items()]
    used: set[str] = set()
    plan = TensorParallelPlan(blocks=[n for n, _ in find_blocks(model)], sequence_parallel=sequence_parallel)
    fused = _fused_projections(model)
    for name, module in model.named_modules():
        for text, regex, style in compiled:
            if name and regex.fullmatch(name):
                used.add(text)
                plan.styles[name] = style
                problems += _check_module(name, module, style, fused)
                break
    missing = [text for text, _, _ in compiled if text not in used]
    if missing:
        problems.append(f"tp_plan patterns {missing} match no module of {type(model).__name__}")
    if problems:
        raise ValueError("invalid tensor-parallel plan:\n  - " + "\n  - ".join(problems))
    for parent in sorted({n.rsplit(".", 1)[0] for n, s in plan.styles.items() if s == "colwise" and "." in n}):
        if any(isinstance(getattr(model.get_submodule(parent), a, None), int) for a in HEAD_ATTRIBUTES):
            plan.attention.append(parent)
    return plan


def _check_module(name: str, module: nn.Module, style: str, fused: set[str]) -> list[str]:
    if style in ("colwise", "rowwise", "colwise_rep") and not (is_projection(module) or isinstance(
            module, nn.Embedding)):
        return [f"{name} is a {type(module).__name__}; {style!r} applies to Linear, Conv1D and Embedding layers"]
    if style in ("colwise", "colwise_rep") and name in fused:
        return [f"{name} is a fused projection (e.g. q, k and v side by side); splitting it column-wise would "
                "give each rank a mix of them. Keep it 'replicate', or split it into separate layers"]
    return []


def _fused_projections(model: nn.Module) -> set[str]:
    found = set()
    for block_name, block in find_blocks(model) or [("", model)]:
        prefix = f"{block_name}." if block_name else ""
        found |= {prefix + s.inputs[0][0] for s in _stages(block)[0] if s.fused}
    return found


# -- applying a plan ------------------------------------------------------------------------------------
def _styles() -> dict[str, Callable[[bool], Any]]:
    class Colwise(ColwiseParallel):
        """ColwiseParallel that also splits transformers' Conv1D (weight stored as (in, out))."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            return _distribute(self, module, device_mesh, {"weight": Shard(1), "bias": Shard(0)})

    class Rowwise(RowwiseParallel):
        """RowwiseParallel that also splits transformers' Conv1D, and takes an embedding's token ids whole."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            if isinstance(module, nn.Embedding):
                self.input_layouts = (Replicate(),)  # a vocabulary-split embedding reads every token id
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)
            return _distribute(self, module, device_mesh, {"weight": Shard(0), "bias": Replicate()})

    seq = Shard(1)
    return {
        "colwise": lambda sp: Colwise(input_layouts=seq) if sp else Colwise(),
        "rowwise": lambda sp: Rowwise(output_layouts=seq, use_local_output=False) if sp else Rowwise(),
        "colwise_rep": lambda sp: Colwise(input_layouts=seq if sp else None, output_layouts=Replicate()),
        "sequence_parallel": lambda sp: SequenceParallel(),
    }


def _distribute(style: Any, module: nn.Module, mesh: Any, placements: dict[str, Any]) -> nn.Module:
    def partition(name: str, mod: nn.Module, device_mesh: Any) -> None:
        if mod is not module:
            return
        for pname, param in list(mod.named_parameters(recurse=False)):
            shard = distribute_tensor(param, device_mesh, [placements[pname]], src_data_rank=style.src_data_rank)
            mod.register_parameter(pname, nn.Parameter(shard, requires_grad=param.requires_grad))

    desired = getattr(style, "desired_input_layouts", None)
    return distribute_module(module, mesh, partition,
                             partial(style._prepare_input_fn, style.input_layouts, desired),
                             partial(style._prepare_output_fn, style.output_layouts, style.use_local_output))


def tensor_parallel_plan(model: nn.Module, tp_size: int, tp_plan: dict[str, str] | None = None,
                         sequence_parallel: bool = False) -> TensorParallelPlan:
    """The plan for ``model``: from the user's ``tp_plan`` patterns if given, else the matched blocks."""
    if tp_plan:
        return plan_from_patterns(model, tp_plan, sequence_parallel, tp_size)
    return match_blocks(model, tp_size, sequence_parallel)


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: TensorParallelPlan) -> None:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` following ``plan``."""
    makers = _styles()
    styles = {name: makers[style](plan.sequence_parallel) for name, style in plan.styles.items() if style in makers}
    if styles:
        parallelize_module(model, tp_mesh, styles)
    size = tp_mesh.size()
    for name in plan.attention:
        _divide_heads(model.get_submodule(name) if name else model, size, name)
    if plan.sequence_parallel and plan.blocks:
        _bound_sequence_parallel(model.get_submodule(plan.blocks[0]), model.get_submodule(plan.blocks[-1]),
                                 tp_mesh)
    for note in plan.notes:
        logger.info("tensor parallel: %s", note)


def _divide_heads(module: nn.Module, size: int, name: str) -> None:
    for attribute in HEAD_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            if value % size:
                raise ValueError(f"{name or type(module).__name__}.{attribute}={value} does not divide by "
                                 f"tp_size={size}")
            setattr(module, attribute, value // size)


def _bound_sequence_parallel(first: nn.Module, last: nn.Module, mesh: Any) -> None:
    """Blocks pass sequence-sharded DTensors to each other: shard the first block's input (a local slice,
    no communication) and gather the last block's output back to a plain tensor."""
    def shard(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def split(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                return DTensor.from_local(t, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(1)])
            return t
        if args:
            return (split(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            kwargs = {**kwargs, "hidden_states": split(kwargs["hidden_states"])}
        return args, kwargs

    def gather(module: nn.Module, args: tuple, output: Any) -> Any:
        def full(t: Any) -> Any:
            return t.redistribute(mesh, [Replicate()]).to_local() if isinstance(t, DTensor) else t
        if isinstance(output, (tuple, list)) and output:
            return type(output)([full(output[0]), *output[1:]])
        return full(output)

    first.register_forward_pre_hook(shard, with_kwargs=True)
    last.register_forward_hook(gather)
