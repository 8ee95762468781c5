"""DeepSpeed engines' own checkpoints, inside an overdrive checkpoint folder.

``save_state`` asks each engine to write its checkpoint (weights, ZeRO partitions of the optimizer, the
scheduler and the engine's counters, in DeepSpeed's format) where Accelerate's ``save_state`` has it write:
``<folder>/pytorch_model[_<i>]/`` and the ``latest`` file (overdrive's resharding layout and earlier
versions: ``<folder>/deepspeed/model_<i>/``), while the folder is still the temporary one, so the manifest lists and checksums those files too and the
folder still appears by one rename. ``load_state`` checks the files against the manifest first, then
lets each engine load its own. DeepSpeed reads its files with pickle (``torch.load(weights_only=False)``):
before that, every global the files refer to is checked against the few DeepSpeed classes its
checkpoints hold, so a file that would run other code is refused unless ``allow_pickle=True``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

from overdrive.strategies.deepspeed.objects import DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper

FOLDER = "deepspeed"
#: the globals DeepSpeed's checkpoint files refer to besides torch's own safe types
KNOWN_GLOBALS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "collections.OrderedDict",
})


if TYPE_CHECKING:
    class DeepSpeedEngine(nn.Module):
        """What overdrive calls on ``deepspeed.runtime.engine.DeepSpeedEngine`` (an optional, untyped package)."""

        module: nn.Module

        def save_checkpoint(self, save_dir: str, tag: str | None = None, **kwargs: Any) -> Any: ...
        def load_checkpoint(self, load_dir: str, tag: str | None = None, **kwargs: Any) -> tuple[Any, Any]: ...
        def zero_optimization_partition_weights(self) -> bool: ...
        def _zero3_consolidated_16bit_state_dict(self) -> dict[str, Any] | None: ...


def is_engine(obj: Any) -> TypeGuard[DeepSpeedEngine]:
    """Whether ``obj`` is a DeepSpeed engine (without importing DeepSpeed when it is not loaded)."""
    engine_module = sys.modules.get("deepspeed.runtime.engine")
    return engine_module is not None and isinstance(obj, engine_module.DeepSpeedEngine)


class EngineCheckpoint:
    """The ability of the DeepSpeed strategy to keep engine state in a checkpoint folder; checkpoint code
    asks ``owns(obj)`` to leave those objects out of its own files."""

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` (a prepared model, optimizer or scheduler) is saved by its engine."""
        for candidate in (obj, getattr(obj, "optimizer", None), getattr(obj, "scheduler", None)):
            if is_engine(candidate) or isinstance(candidate, (DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper)):
                return True
        return False

    def save(self, folder: Path, models: list[nn.Module], accelerate: bool = False) -> None:
        """Every engine's checkpoint into ``folder/pytorch_model[_<i>]`` as Accelerate names it (``accelerate``),
        else ``folder/deepspeed/model_<i>`` (a collective: call on every rank)."""
        for index, model in enumerate(models):
            if not is_engine(model):
                continue
            if accelerate:
                model.save_checkpoint(str(folder), tag=accelerate_tag(index))
            else:
                model.save_checkpoint(str(folder / FOLDER), tag=f"model_{index}", save_latest=False)

    def load(self, folder: Path, models: list[nn.Module], allow_pickle: bool = False,
             scheduler_states: bool = True) -> None:
        """Load every engine's checkpoint from ``folder`` (a collective); ``scheduler_states=False`` leaves the
        engine's scheduler to ``scheduler.bin`` (a scheduler of the script's own, in Accelerate's layout)."""
        for index, model in enumerate(models):
            if not is_engine(model):
                continue
            root, tag = folder, accelerate_tag(index)
            if not (root / tag).is_dir():
                root, tag = folder / FOLDER, f"model_{index}"
            tag_folder = root / tag
            if not tag_folder.is_dir():
                raise FileNotFoundError(f"{folder} has no DeepSpeed checkpoint for model {index} (neither "
                                        f"{accelerate_tag(index)}/ nor {FOLDER}/model_{index}/); was it saved by a run "
                                        "that prepared the same models with DeepSpeed?")
            if not allow_pickle:
                refuse_unknown_globals(tag_folder)
            path, _ = model.load_checkpoint(str(root), tag=tag, load_module_strict=True,
                                            load_optimizer_states=True, load_lr_scheduler_states=scheduler_states)
            if path is None:
                raise RuntimeError(f"DeepSpeed could not load its checkpoint for model {index} from {tag_folder}")

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The engine's full weights on the CPU by the user's names; under ZeRO-3 gathered one module at a time
        to rank 0 (other ranks get an empty dict). Weights keep the engine's dtype (bf16 under bf16)."""
        assert is_engine(model)  # the caller asked owns(model) first
        if model.zero_optimization_partition_weights():
            return model._zero3_consolidated_16bit_state_dict() or {}
        return {name: tensor.detach().cpu() for name, tensor in model.module.state_dict().items()}


def accelerate_tag(index: int) -> str:
    """The folder Accelerate's ``save_state`` has engine ``index`` write its checkpoint in."""
    return "pytorch_model" if index == 0 else f"pytorch_model_{index}"


def refuse_unknown_globals(folder: Path) -> None:
    """Raise when a DeepSpeed file in ``folder`` refers to a global outside :data:`KNOWN_GLOBALS`."""
    found = {}
    for path in sorted(folder.rglob("*.pt")):
        unknown = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path))) - KNOWN_GLOBALS)
        if unknown:
            found[path.name] = unknown
    if found:
        listed = "; ".join(f"{name}: {', '.join(names)}" for name, names in found.items())
        raise PermissionError(f"{folder} holds DeepSpeed files that would run code when read ({listed}); "
                              "load_state(..., allow_pickle=True) reads them if you trust where they came from")
