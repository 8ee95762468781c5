"""The one finder of a model's repeated blocks (transformer layers), used by every transform that works per
block: tensor parallel (which blocks to match), activation checkpointing and compile (what to wrap),
FSDP2's wrap policy when it names no class, and the pipeline split (which list to cut into stages). One finder, so the
transforms agree on one model.

The blocks are the items of one ``nn.ModuleList`` / ``nn.Sequential`` of at least two entries:

1. lists whose items with parameters are all of one class ("repeated"), preferring one named as models
   usually name them (``BLOCK_LIST_NAMES``), then the most items, then the most parameters, then the
   shallowest;
2. else (pipeline only: a stack of different layers can still be cut) a root ``nn.Sequential``, or a
   list named as above.

Items without parameters are skipped: a pipeline stage keeps parameter-free placeholders for the blocks
other stages hold. ``BLOCK_LIST_NAMES`` lists the usual names (Llama's ``model.layers``, GPT-2's
``transformer.h``, BERT's ``encoder.layer``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeGuard

from torch import nn

#: attribute names that hold a model's repeated blocks, in order of preference
BLOCK_LIST_NAMES = ("layers", "h", "blocks", "layer")


def num_parameters(module: nn.Module) -> int:
    """The number of parameter elements under ``module``."""
    return sum(p.numel() for p in module.parameters())


def is_block_list(module: nn.Module) -> TypeGuard[nn.ModuleList | nn.Sequential]:
    """Whether ``module`` is a container the blocks can sit in (a ModuleList or a Sequential)."""
    return isinstance(module, (nn.ModuleList, nn.Sequential))


def _items(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The items of a list that hold parameters (placeholders of other pipeline stages left out)."""
    return [(key, m) for key, m in module._modules.items() if m is not None and any(True for _ in m.parameters())]


def _candidates(model: nn.Module) -> Iterable[tuple[str, nn.Module, list[tuple[str, nn.Module]]]]:
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) >= 2:
            items = _items(module)
            if items:
                yield name, module, items


def _repeated(items: list[tuple[str, nn.Module]]) -> bool:
    return len({type(m) for _, m in items}) == 1


def find_block_list(model: nn.Module, *, repeated_only: bool = False) -> str | None:
    """The name of the list holding ``model``'s blocks (``""`` for the model itself), or None.

    With ``repeated_only`` only a list of one block class counts (tensor parallel, checkpointing and
    compile need repeated blocks; the pipeline can also cut a stack of different layers)."""
    repeated = [(name, module, items) for name, module, items in _candidates(model) if _repeated(items)]
    if repeated:
        def rank(entry: tuple[str, nn.Module, list]) -> tuple:
            name, module, items = entry
            return (name.rpartition(".")[2] in BLOCK_LIST_NAMES, len(items), num_parameters(module),
                    -name.count("."))
        return max(repeated, key=rank)[0]
    if repeated_only:
        return None
    if isinstance(model, nn.Sequential) and len(model) >= 2:
        return ""
    named = [(name, module) for name, module, _ in _candidates(model) if name.rpartition(".")[2] in BLOCK_LIST_NAMES]
    if named:
        return max(named, key=lambda item: (num_parameters(item[1]), -item[0].count(".")))[0]
    return None


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, block)`` for each of ``model``'s repeated blocks, in order; ``[]`` when it has none."""
    path = find_block_list(model, repeated_only=True)
    if path is None:
        return []
    container = model.get_submodule(path) if path else model
    return [(f"{path}.{key}" if path else key, block) for key, block in _items(container)]


def blocks_to_wrap(model: nn.Module, class_names: Iterable[str] | None = None) -> list[nn.Module]:
    """The blocks activation checkpointing and compile wrap (and FSDP2 shards when its policy names no
    class): the modules of the classes the user named (FSDP's ``transformer_cls_names_to_wrap``), else
    the repeated blocks of ``find_blocks``, else the modules of the model's ``_no_split_modules`` classes
    (which can name more than the blocks: BERT's lists its embeddings too)."""
    named = _of_classes(model, class_names)
    if named:
        return named
    found = [block for _, block in find_blocks(model)]
    return found or _of_classes(model, getattr(model, "_no_split_modules", None))


def _of_classes(model: nn.Module, class_names: Iterable[str] | None) -> list[nn.Module]:
    names = set(class_names or [])
    return [m for m in model.modules() if type(m).__name__ in names] if names else []
