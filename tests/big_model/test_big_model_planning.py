"""Sizes, memory and device-map planning (overdrive.big_model.sizes / planning)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from overdrive.big_model import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
)
from tests.big_model.big_model_helpers import Block, Toy, llama


def test_sizes_and_units() -> None:
    assert convert_file_size_to_int("1GB") == 10**9
    assert convert_file_size_to_int("2GiB") == 2 * 2**30
    assert convert_file_size_to_int("8Mb") == 10**6
    assert convert_file_size_to_int(123) == 123
    with pytest.raises(ValueError, match="'12 parsecs'"):
        convert_file_size_to_int("12 parsecs")
    assert dtype_byte_size(torch.float16) == 2 and dtype_byte_size(torch.bool) == 1 / 8
    assert dtype_byte_size("int4") == 0.5
    sizes = compute_module_sizes(Toy())
    assert sizes["embed"] == 800 and sizes["blocks.0"] == 880 and sizes["head"] == 0  # tied: counted once
    assert sizes[""] == 800 + 4 * 880 + 40 + 4  # with the buffers, persistent or not
    half = compute_module_sizes(Toy(), dtype=torch.float16)
    assert half["blocks.0"] == 440


def test_max_layer_and_ties() -> None:
    model = Toy()
    sizes = compute_module_sizes(model)
    top = list(model.named_children())
    assert get_max_layer_size(top, sizes, ["Block"]) == (880, ["blocks.0", "blocks.1", "blocks.2", "blocks.3"])
    assert get_max_layer_size(top, sizes, []) == (800, ["embed"])
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    assert find_tied_parameters(Toy(tie=False)) == []


def test_init_empty_weights_uses_no_memory() -> None:
    with init_empty_weights():
        model = Toy()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.scale.device.type == "cpu"  # buffers stay real: constructors compute them
    assert model.head.weight is model.embed.weight
    with init_empty_weights(include_buffers=True):
        model = Toy()
    assert model.scale.device.type == "meta"
    with init_on_device("meta"):
        layer = nn.Linear(4, 4)
    assert layer.weight.device.type == "meta" and layer.weight.requires_grad
    assert nn.Linear(2, 2).weight.device.type == "cpu"  # the patch is gone after the block


EXPECTED = [
    # (max_memory, no_split, tied, expected map), worked out by hand: sizes are embed 800, Block 880 (fc1,
    # fc2 440 each), head 0 when tied (counted with embed) else 800; device 0 and the CPU keep room for the
    # largest layer (880 with Block no-split, else 800), since offloaded layers run there.
    ({0: 2000, 1: 2000, "cpu": 5000}, ["Block"], True,
     {"embed": 0, "head": 0, "blocks.0": 1, "blocks.1": 1, "blocks.2": "cpu", "blocks.3": "cpu",
      "scale": "cpu", "cache": "cpu"}),
    ({0: 2000, 1: 2000, "cpu": 5000}, None, True,
     {"embed": 0, "head": 0, "blocks.0.fc1": 0, "blocks.0.fc2": 1, "blocks.1": 1, "blocks.2.fc1": 1,
      "blocks.2.fc2": "cpu", "blocks.3": "cpu", "scale": "cpu", "cache": "cpu"}),
    ({0: 1500, 1: 1500, "cpu": 2000}, ["Block"], True,
     {"embed": 1, "head": 1, "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "disk",
      "scale": "disk", "cache": "disk"}),
    ({0: "3KB", "cpu": 1000}, ["Block"], False,
     {"embed": 0, "blocks.0": 0, "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "disk", "head": "disk",
      "scale": "disk", "cache": "disk"}),
]


@pytest.mark.parametrize("max_memory,no_split,tie,expected", EXPECTED)
def test_exact_maps_on_devices_this_machine_lacks(max_memory: dict, no_split: list | None, tie: bool,
                                                  expected: dict) -> None:
    """Device 0 keeps room for the largest layer (it runs offloaded layers), as does the CPU; a Block is
    never split when named no-split; the tied head goes wherever the embedding goes."""
    with init_empty_weights():
        model = Toy(tie=tie)
    device_map = infer_auto_device_map(model, max_memory, no_split)
    assert device_map == expected
    if no_split:
        assert not any(key.count(".") > 1 for key in device_map)  # no Block was split
    if tie:
        assert device_map["head"] == device_map["embed"]
    check_device_map(model, device_map)
    import accelerate.utils as accelerate_utils

    assert accelerate_utils.infer_auto_device_map(model, dict(max_memory), no_split) == expected


@pytest.mark.optional
def test_llama_maps_match_accelerate() -> None:
    """The same maps and balanced memories as Accelerate's planner, on a Llama model and fake GPUs."""
    import accelerate.utils as accelerate_utils

    for tie in (True, False):
        model = llama(layers=6, tie=tie)
        total = compute_module_sizes(model)[""]
        for memory in ({0: total // 3, 1: total // 3, "cpu": total // 2},
                       {0: total // 5, 1: total // 5, "cpu": total // 4}, {"cpu": total // 2}):
            for no_split in (["LlamaDecoderLayer"], None):
                for dtype in (None, "float16"):
                    ours = infer_auto_device_map(model, dict(memory), no_split, dtype=dtype)
                    theirs = accelerate_utils.infer_auto_device_map(model, dict(memory), no_split, dtype=dtype)
                    assert ours == theirs, (memory, no_split, dtype)
                    assert get_balanced_memory(model, dict(memory), no_split, dtype=dtype) == \
                        accelerate_utils.get_balanced_memory(model, dict(memory), no_split, dtype=dtype)
        if tie:
            layer_devices = {v for k, v in ours.items() if k.startswith("model.layers.") and k.count(".") > 2}
            assert not layer_devices  # no decoder layer was split under no_split


def test_get_max_memory_reads_this_machine() -> None:
    memory = get_max_memory()
    assert memory["cpu"] > 0
    assert get_max_memory({"cpu": "1GB", 0: "2GB"}) == {0: 2 * 10**9, "cpu": 10**9}
    with pytest.raises(ValueError, match="'gpu0'"):
        get_max_memory({"gpu0": "1GB"})


def test_check_device_map_names_problems() -> None:
    model = Toy()
    # an unknown key is a warning (as in Accelerate), a tensor without a device an error
    with pytest.warns(UserWarning, match=r"do not match any submodules.*\['blocks.7'\]"), \
            pytest.raises(ValueError, match=r"gives no device for these tensors: blocks.3"):
        check_device_map(model, {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "cpu", "blocks.2": "cpu",
                                 "blocks.7": "cpu", "head": "cpu", "scale": "cpu"})
    check_device_map(model, {"": "cpu"})


def test_clean_device_map() -> None:
    assert clean_device_map({"a.x": 0, "a.y": 0, "b": 1}) == {"a": 0, "b": 1}
    assert clean_device_map({"a.x": 0, "a.y": 0}) == {"": 0}
    assert clean_device_map({"a.x": 0, "a.y": 1, "b": 1}) == {"a.x": 0, "a.y": 1, "b": 1}
    assert isinstance(Block(), nn.Module)


# accelerate.inference.generate_device_map(llama(layers=4, tie=False), n, ["LlamaDecoderLayer"]) of Accelerate
# 1.15.0, the last release with accelerate.inference (1.16.0 dropped the pippy module); checked against it
_LAYERS = [f"model.layers.{i}" for i in range(4)]
_PIPPY_MAPS_1_15 = {
    1: {"model": "cpu", "lm_head": "cpu"},
    2: {"model.embed_tokens": 0, **dict(zip(_LAYERS, [0, 1, 1, 1])), "model.norm": 1, "model.rotary_emb": 1,
        "lm_head": 1},
    3: {"model.embed_tokens": 1, **dict(zip(_LAYERS, [1, 2, 2, 2])), "model.norm": 2, "model.rotary_emb": 2,
        "lm_head": "disk"},
}


def _accelerate_pippy_map(model: nn.Module, n: int) -> dict:
    """Accelerate's ``generate_device_map`` for ``n`` processes, or 1.15.0's map where the installed one has none."""
    try:
        import accelerate.inference as accelerate_inference
    except ModuleNotFoundError:
        return _PIPPY_MAPS_1_15[n]
    return dict(accelerate_inference.generate_device_map(model, n, ["LlamaDecoderLayer"]))


@pytest.mark.optional
def test_fallback_allocation_and_pippy_maps_match_accelerate() -> None:
    """An accelerator too small for the next block gets a smaller module instead of staying empty."""
    import accelerate.utils as accelerate_utils

    from overdrive.big_model import fallback_allocate, get_module_leaves
    from overdrive.inference import find_pippy_batch_size, generate_device_map

    model = llama(layers=4, tie=False)
    sizes = compute_module_sizes(model)
    layer = sizes["model.layers.0"]
    memory = {0: layer // 2 + sizes["model.embed_tokens"], 1: 3 * layer, "cpu": 10 * layer}
    ours = infer_auto_device_map(model, dict(memory), ["LlamaDecoderLayer"], fallback_allocation=True)
    theirs = accelerate_utils.infer_auto_device_map(model, dict(memory), ["LlamaDecoderLayer"],
                                                    fallback_allocation=True)
    assert ours == theirs
    assert 0 in ours.values()  # without the fallback, device 0 would hold nothing
    modules = list(model.named_children())
    assert fallback_allocate(modules, sizes, layer)[0] == accelerate_utils.modeling.fallback_allocate(
        modules, sizes, layer)[0]
    assert get_module_leaves(sizes) == accelerate_utils.modeling.get_module_leaves(sizes)
    for n in (1, 2, 3):
        assert generate_device_map(model, n, ["LlamaDecoderLayer"]) == _accelerate_pippy_map(model, n)
    assert find_pippy_batch_size((1, torch.zeros(3, 2)), {}) == 3
    assert find_pippy_batch_size((), {"x": torch.zeros(5)}) == 5
