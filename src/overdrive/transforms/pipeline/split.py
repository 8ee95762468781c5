"""Cutting a model into pipeline stages, keeping the user's module classes and parameter names.

A model is split inside one list of repeated blocks (an ``nn.Sequential``, or a ``ModuleList`` /
``Sequential`` such as ``layers``, ``h`` or ``blocks``). Stage ``s`` is a shallow copy of the model in
which:

- blocks outside the stage are replaced by parameter-free placeholders (``SkippedBlock``) at the same
  positions, so ``model.layers[2]`` keeps its name, ``enumerate(self.layers)`` its indices, and the
  model's own ``forward`` runs unchanged;
- the modules registered *before* the block list along the path to it (embeddings, positional tables,
  dropout) live on the first stage; on later stages those with parameters become ``ShapeOnly`` stubs that
  return zeros of the right shape (their values are never used: the stage's first block receives the
  previous stage's activations instead);
- the modules registered *after* the list (final norm, output head) live on the last stage; on earlier
  stages those with parameters become ``RemovedModule`` stubs that fail loudly if ever called (a stage
  stops right after its last block).

Parameter-free modules (rotary embeddings, masks) stay on every stage. Nothing is traced, so models with
data-dependent Python control flow split as easily as plain ones.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from overdrive.config.choices import invalid_choice
from overdrive.config.pipeline import BALANCE_CHOICES
from overdrive.transforms.blocks import BLOCK_LIST_NAMES, find_block_list, is_block_list, num_parameters


class SplitError(ValueError):
    """A model that cannot be split as asked; the message says why and how to give split points."""


@dataclass(frozen=True)
class StageLayout:
    """Where the stages begin and end: ``bounds[s]`` is the half-open range of block indices of stage s."""

    list_path: str
    block_names: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]
    prologue: tuple[str, ...]
    epilogue: tuple[str, ...]

    @property
    def num_stages(self) -> int:
        """The number of stages."""
        return len(self.bounds)

    def describe(self) -> str:
        """The blocks of each stage, as text for messages."""
        parts = []
        for s, (start, stop) in enumerate(self.bounds):
            names = f"{self.block_names[start]}..{self.block_names[stop - 1]}"
            parts.append(f"stage {s}: {names} ({stop - start} blocks)")
        return "; ".join(parts)


# -- finding the blocks: overdrive.transforms.blocks (one finder for every transform) ----------------
_numel = num_parameters
_is_list = is_block_list


def _path_modules(model: nn.Module, path: str) -> list[tuple[nn.Module, str]]:
    """(ancestor, name of its child on the path) from the root down to the block list's parent."""
    chain, module = [], model
    for part in path.split(".") if path else []:
        chain.append((module, part))
        module = _child(module, part)
    return chain


def _around(model: nn.Module, path: str) -> tuple[list[str], list[str], list[str]]:
    """Names of the modules before and after the block list, and of ancestors with parameters of their own."""
    before, after, owners = [], [], []
    prefix = ""
    for ancestor, child in _path_modules(model, path):
        if any(True for _ in ancestor.parameters(recurse=False)):
            owners.append(prefix.rstrip(".") or type(model).__name__)
        names = [n for n, m in ancestor._modules.items() if m is not None]
        cut = names.index(child)
        before += [prefix + n for n in names[:cut]]
        after += [prefix + n for n in names[cut + 1:]]
        prefix += child + "."
    return before, after, owners


# -- planning the stages -----------------------------------------------------------------------------
def plan_stages(model: nn.Module, num_stages: int, split_points: Sequence[str] | None = None,
                balance: str = "layers") -> StageLayout:
    """Where ``model`` splits into ``num_stages`` stages: at ``split_points`` (names of the blocks where
    stages 1.. begin) or balanced by layer count or parameter count. Raises ``SplitError`` naming every
    problem and what to give instead."""
    path = _list_of(split_points) if split_points else find_block_list(model)
    if path is None:
        raise SplitError(
            f"cannot split {type(model).__name__} into pipeline stages: found no list of repeated blocks (an "
            f"nn.Sequential model, or an nn.ModuleList named one of {list(BLOCK_LIST_NAMES)}). Give the blocks "
            "where stages begin, e.g. PipelineConfig(split_points=['encoder.blocks.4']): they must be items of "
            "one nn.ModuleList or nn.Sequential, whose forward calls them in order")
    try:
        blocks = model.get_submodule(path) if path else model
    except AttributeError:
        blocks = None
    if blocks is None or not _is_list(blocks):
        raise SplitError(f"split_points {list(split_points or [])} must name items of one nn.ModuleList or "
                         f"nn.Sequential of {type(model).__name__}, but {path!r} is not one; names look like "
                         f"{_example_names(model)}")
    names = tuple(f"{path}.{k}" if path else k for k in blocks._modules)
    before, after, owners = _around(model, path)
    problems = []
    if owners:
        problems.append(f"{', '.join(owners)} holds parameters of its own, outside any submodule: they cannot be "
                        "placed on one stage; move them into a submodule (e.g. an nn.Module holding the parameter)")
    if len(names) < num_stages:
        problems.append(f"{num_stages} pipeline stages need at least {num_stages} blocks, but {path or 'the model'} "
                        f"of {type(model).__name__} has {len(names)}; lower pp_size or stages_per_rank")
    if problems:
        raise SplitError(f"cannot split {type(model).__name__}:\n  - " + "\n  - ".join(problems))
    if split_points:
        bounds = _bounds_from_points(list(split_points), names, num_stages)
    elif balance == "params":
        costs = [_numel(b) for b in blocks]
        costs[0] += sum(_numel(model.get_submodule(n)) for n in before)
        costs[-1] += sum(_numel(model.get_submodule(n)) for n in after)
        bounds = balanced_bounds(costs, num_stages)
    elif balance == "layers":
        bounds = even_bounds(len(names), num_stages)
    else:
        raise SplitError(invalid_choice(f"balance={balance!r}", balance, BALANCE_CHOICES))
    return StageLayout(path, names, tuple(bounds), tuple(before), tuple(after))


def _list_of(split_points: Sequence[str]) -> str:
    parents = {p.rpartition(".")[0] for p in split_points}
    if len(parents) != 1:
        raise SplitError(f"split_points {list(split_points)} must all be items of one list of blocks, but they sit "
                         f"in {sorted(parents)}")
    return parents.pop()


def _example_names(model: nn.Module) -> list[str]:
    path = find_block_list(model)
    if path is None:
        return [n for n, _ in model.named_children()][:4]
    items = list(model.get_submodule(path)._modules) if path else list(model._modules)
    return [f"{path}.{k}" if path else k for k in items[1:3]]


def _bounds_from_points(points: list[str], names: tuple[str, ...], num_stages: int) -> list[tuple[int, int]]:
    problems = []
    if len(points) != num_stages - 1:
        problems.append(f"{len(points)} split points give {len(points) + 1} stages, but pp_size x stages_per_rank "
                        f"is {num_stages}; give {num_stages - 1} split points")
    unknown = [p for p in points if p not in names]
    if unknown:
        problems.append(f"split points {unknown} are not blocks; the blocks are {names[0]} .. {names[-1]}")
    starts = [names.index(p) for p in points if p in names]
    if 0 in starts:
        problems.append(f"split point {names[0]!r} would leave stage 0 without blocks; stages begin after it")
    if starts != sorted(set(starts)):
        problems.append(f"split points {points} must be distinct and in the order of the blocks")
    if problems:
        raise SplitError("invalid split_points:\n  - " + "\n  - ".join(problems))
    edges = [0, *starts, len(names)]
    return [(edges[i], edges[i + 1]) for i in range(num_stages)]


def even_bounds(num_blocks: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous ranges whose sizes differ by at most one; the extra blocks go to the middle stages first
    (the first and last stages also hold the embedding and the head)."""
    sizes = [num_blocks // num_stages] * num_stages
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    for s in order[: num_blocks % num_stages]:
        sizes[s] += 1
    edges = [0]
    for size in sizes:
        edges.append(edges[-1] + size)
    return [(edges[i], edges[i + 1]) for i in range(num_stages)]


def balanced_bounds(costs: list[int], num_stages: int) -> list[tuple[int, int]]:
    """Contiguous, non-empty ranges of ``costs`` minimising the largest range's total (exact, by dynamic
    programming over cut positions)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for s in range(1, num_stages + 1):
        for end in range(s, n - (num_stages - s) + 1):
            for start in range(s - 1, end):
                value = max(best[s - 1][start], prefix[end] - prefix[start])
                if value < best[s][end]:
                    best[s][end], cut[s][end] = value, start
    edges = [n]
    for s in range(num_stages, 0, -1):
        edges.append(cut[s][edges[-1]])
    edges.reverse()
    return [(edges[i], edges[i + 1]) for i in range(num_stages)]


# -- building a stage --------------------------------------------------------------------------------
class SkippedBlock(nn.Module):
    """Stands where a block of another stage was: returns its first input unchanged."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.block_name = name

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else next(iter(kwargs.values()), None)

    def extra_repr(self) -> str:
        return f"{self.block_name} (on another pipeline stage)"


class ShapeOnly(nn.Module):
    """Stands for a first-stage module (an embedding) on a later stage: returns zeros shaped as the module's
    output, computed by running a parameter-less meta-device copy of it."""

    def __init__(self, module: nn.Module, name: str, keep: dict[str, nn.Parameter] | None = None) -> None:
        super().__init__()
        self.module_name = name
        # kept out of the module tree, so it adds no parameters, names or memory
        memo = {id(t): _meta_like(t) for t in [*module.parameters(), *module.buffers()]}
        self.__dict__["_meta"] = copy.deepcopy(module, memo)
        _keep(self, keep)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = next((t.device for t in _tensors((args, kwargs))), torch.device("cpu"))
        out = self.__dict__["_meta"](*_to_meta(args), **_to_meta(kwargs))
        return _zeros_like_tree(out, device)

    def extra_repr(self) -> str:
        return f"{self.module_name} (on the first pipeline stage; zeros of its output shape here)"


class RemovedModule(nn.Module):
    """Stands for a last-stage module (a final norm or head) on an earlier stage, which stops after its
    last block and so never calls it."""

    def __init__(self, name: str, keep: dict[str, nn.Parameter] | None = None) -> None:
        super().__init__()
        self.module_name = name
        _keep(self, keep)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.module_name} lives on the last pipeline stage, but this stage called it before its last "
            "block: the model's forward uses it before (or between) the blocks. Give split points, or register "
            "the module before the block list so that it lands on the first stage")

    def extra_repr(self) -> str:
        return f"{self.module_name} (on the last pipeline stage)"


def _keep(stub: nn.Module, keep: dict[str, nn.Parameter] | None) -> None:
    """Register on a stub the parameters of the module it replaces that its stage uses elsewhere (tied
    weights), so that the stage names them as the whole model does (``lm_head.weight`` and
    ``transformer.wte.weight`` for one tensor)."""
    for name, param in (keep or {}).items():
        stub.register_parameter(name, param)


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    meta = torch.empty_like(tensor, device="meta")
    return nn.Parameter(meta, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _to_meta(tree: Any) -> Any:
    return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, tree)


def _zeros_like_tree(tree: Any, device: torch.device) -> Any:
    return tree_map(lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device)
                    if isinstance(t, torch.Tensor) else t, tree)


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object of the same class sharing the children, parameters and buffers, with its own
    registries (children, hooks), so that replacing a child or adding a hook leaves the original alone."""
    new = copy.copy(module)
    for key, value in module.__dict__.items():
        if isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    return new


def build_stage_model(model: nn.Module, layout: StageLayout, stage: int) -> nn.Module:
    """Stage ``stage`` of ``model`` (see the module docstring); ``model`` itself is left unchanged."""
    first, last = stage == 0, stage == layout.num_stages - 1
    start, stop = layout.bounds[stage]
    root = shallow_copy(model)
    parent = root
    chain = _path_modules(model, layout.list_path)
    for _, child in chain:
        copied = shallow_copy(_child(parent, child))
        parent._modules[child] = copied
        parent = copied
    blocks = parent if layout.list_path else root
    for index, key in enumerate(list(blocks._modules)):
        if not start <= index < stop:
            blocks._modules[key] = SkippedBlock(layout.block_names[index])
    held = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if stage_of(name, layout) == stage}
    for name in layout.prologue if not first else ():
        _replace(root, name, held, lambda m, n, keep: ShapeOnly(m, n, keep))
    for name in layout.epilogue if not last else ():
        _replace(root, name, held, lambda m, n, keep: RemovedModule(n, keep))
    return root


def _replace(root: nn.Module, name: str, held: set[int], make: Any) -> None:
    owner_name, _, attribute = name.rpartition(".")
    owner = root.get_submodule(owner_name) if owner_name else root
    module = owner._modules[attribute]
    if module is not None and any(True for _ in module.parameters()):
        keep = {n: p for n, p in module.named_parameters(recurse=False) if id(p) in held}
        owner._modules[attribute] = make(module, name, keep)


def stage_of(name: str, layout: StageLayout) -> int:
    """The stage that holds the parameter or module ``name`` of the whole model."""
    for index, block in enumerate(layout.block_names):
        if name == block or name.startswith(block + "."):
            return next(s for s, (start, stop) in enumerate(layout.bounds) if start <= index < stop)
    if any(name == n or name.startswith(n + ".") for n in layout.epilogue):
        return layout.num_stages - 1
    return 0


def stage_blocks(stage_model: nn.Module, layout: StageLayout, stage: int) -> tuple[nn.Module, nn.Module]:
    """The first and last block of ``stage`` inside its stage model."""
    blocks = stage_model.get_submodule(layout.list_path) if layout.list_path else stage_model
    items = list(blocks._modules)
    start, stop = layout.bounds[stage]
    return _child(blocks, items[start]), _child(blocks, items[stop - 1])


def _child(module: nn.Module, name: str) -> nn.Module:
    """``module``'s registered child ``name``; an error when the slot holds None (a removed child)."""
    child = module._modules[name]
    if child is None:
        raise SplitError(f"{type(module).__name__}.{name} was set to None: a pipeline stage cannot be cut through "
                         "a removed child; delete the attribute or give it a module")
    return child
