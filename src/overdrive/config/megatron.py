"""``MegatronLMPlugin``: Megatron-LM model parallelism settings, and the checks on their values.

Whether megatron-core can be imported is checked by the resolver, not here (this is a plain value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overdrive.config.choices import invalid_choice

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WEIGHT_DECAY_STYLES = ("constant", "linear", "cosine")


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def plugin_problems(plugin: Any, world_size: int | None = None) -> list[str]:
    """Every invalid field of a MegatronLMPlugin, each naming the value and the valid choices."""
    found = []
    for name in ("tp_degree", "pp_degree", "num_micro_batches", "num_layers_per_virtual_pipeline_stage"):
        value = getattr(plugin, name)
        if value is not None and not _positive(value):
            found.append(f"{name}={value!r} is not valid; it must be an integer >= 1")
    tp = plugin.tp_degree if _positive(plugin.tp_degree) else 1
    pp = plugin.pp_degree if _positive(plugin.pp_degree) else 1
    if plugin.sequence_parallelism and tp == 1:
        found.append("sequence_parallelism=True splits activations across the tensor-parallel group, which needs "
                     f"tp_degree > 1 (tp_degree={plugin.tp_degree!r})")
    if plugin.num_layers_per_virtual_pipeline_stage is not None and pp == 1:
        found.append(f"num_layers_per_virtual_pipeline_stage={plugin.num_layers_per_virtual_pipeline_stage!r} "
                     f"interleaves pipeline stages, which needs pp_degree > 1 (pp_degree={plugin.pp_degree!r})")
    if plugin.pipeline_model_parallel_split_rank is not None and pp == 1:
        found.append("pipeline_model_parallel_split_rank needs pp_degree > 1")
    clip = plugin.gradient_clipping
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        found.append(f"gradient_clipping={clip!r} is not valid; give a number >= 0")
    if plugin.lr_decay_style not in LR_DECAY_STYLES:
        found.append(invalid_choice(f"lr_decay_style={plugin.lr_decay_style!r}", plugin.lr_decay_style, LR_DECAY_STYLES))
    if plugin.weight_decay_incr_style not in WEIGHT_DECAY_STYLES:
        found.append(invalid_choice(f"weight_decay_incr_style={plugin.weight_decay_incr_style!r}",
                                    plugin.weight_decay_incr_style, WEIGHT_DECAY_STYLES))
    for name in ("custom_model_provider_function", "custom_prepare_model_function", "custom_get_batch_function",
                 "custom_loss_function", "custom_megatron_datasets_provider_function"):
        value = getattr(plugin, name)
        if value is not None and not callable(value):
            found.append(f"{name}={value!r} is not callable")
    if world_size is not None and world_size % (tp * pp):
        found.append(f"tp_degree x pp_degree = {tp} x {pp} = {tp * pp} does not divide the {world_size} processes; "
                     "the data-parallel degree is the processes divided by that product")
    return found


@dataclass
class MegatronLMPlugin:
    """Megatron-LM model parallelism (``megatron-core``) with Accelerate's fields: ``tp_degree`` tensor
    parallel, ``pp_degree`` pipeline stages (``num_micro_batches`` each step), ``sequence_parallelism``,
    ``recompute_activations``, ``use_distributed_optimizer``, and ``custom_model_provider_function`` that
    builds the model. Checked when the Accelerator is built; needs ``pip install megatron-core``."""

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable | None = None
    scale_lr_cond: Callable | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable | None = None
    custom_prepare_model_function: Callable | None = None
    custom_megatron_datasets_provider_function: Callable | None = None
    custom_get_batch_function: Callable | None = None
    custom_loss_function: Callable | None = None
    other_megatron_args: dict[str, Any] | None = None

    def problems(self, world_size: int | None = None) -> list[str]:
        """Every invalid field (and, given ``world_size``, degrees that do not divide it)."""
        return plugin_problems(self, world_size)
