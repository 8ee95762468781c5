"""Loading, dispatching and offloading (overdrive.big_model.loading / dispatch / hooks / offload)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from overdrive.big_model import (
    AlignDevicesHook,
    CheckpointError,
    ModelHook,
    OffloadedWeightsLoader,
    add_hook_to_module,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    offload_state_dict,
    remove_hook_from_module,
)
from tests.big_model.big_model_helpers import Toy, llama, llama_config

pytestmark = pytest.mark.requires("transformers")  # builds the Llama models

TOKENS = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(1))
HALF_ON_DISK = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "disk", "model.rotary_emb": "cpu",
                "lm_head": "cpu"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path, torch.Tensor]:
    """A tied Llama, saved as 8 safetensors shards with an index, and its logits."""
    model = llama()
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder, max_shard_size="100KB")
    with torch.no_grad():
        logits = model(TOKENS).logits
    return model, folder, logits


def empty_llama() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    with init_empty_weights():
        model = LlamaForCausalLM(llama_config())
    model.tie_weights()
    return model.eval()


def snapshot(model: torch.nn.Module) -> dict:
    """Everything "restored exactly" must bring back."""
    return {
        "state": {k: (v.device, v.dtype, v.clone()) for k, v in model.state_dict(keep_vars=True).items()},
        "params": [(n, type(p), p.requires_grad) for n, p in model.named_parameters()],
        "attrs": [sorted(m.__dict__) for m in model.modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
    }


def assert_same(before: dict, after: dict) -> None:
    assert before["params"] == after["params"] and before["attrs"] == after["attrs"]
    assert before["hooks"] == after["hooks"]
    for name, (device, dtype, value) in before["state"].items():
        now = after["state"][name]
        assert (now[0], now[1]) == (device, dtype) and torch.equal(now[2], value), name


def test_load_and_dispatch_mixing_cpu_and_disk(saved: tuple, tmp_path: Path) -> None:
    reference, folder, logits = saved
    assert len(list(folder.glob("*.safetensors"))) > 2  # really sharded
    model = load_checkpoint_and_dispatch(empty_llama(), folder, device_map=HALF_ON_DISK,
                                         offload_folder=tmp_path / "offload")
    assert model.hf_device_map == HALF_ON_DISK
    assert model.model.layers[1].mlp.up_proj.weight.device.type == "meta"  # really not in memory
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert "model.layers.1.mlp.up_proj.weight" in index and "model.layers.0.mlp.up_proj.weight" not in index
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, logits)
    assert model.model.layers[1].mlp.up_proj.weight.device.type == "meta"  # released after the forward
    expected = reference.generate(TOKENS, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(TOKENS, max_new_tokens=4, do_sample=False, pad_token_id=0), expected)


def test_auto_map_with_cpu_budget_and_dtype(saved: tuple, tmp_path: Path) -> None:
    _, folder, logits = saved
    model = empty_llama()
    model = load_checkpoint_and_dispatch(model, folder, device_map="auto", max_memory={"cpu": 700_000},
                                         no_split_module_classes=["LlamaDecoderLayer"],
                                         offload_folder=tmp_path / "offload")
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, logits)
    staged = load_checkpoint_and_dispatch(empty_llama(), folder, device_map=HALF_ON_DISK, offload_state_dict=True,
                                          offload_folder=tmp_path / "staged")
    with torch.no_grad():
        assert torch.equal(staged(TOKENS).logits, logits)
    half = load_checkpoint_and_dispatch(empty_llama(), folder, dtype=torch.bfloat16,
                                        device_map={"": "cpu"}, keep_in_fp32_modules=None)
    assert half.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    kept = empty_llama()
    load_checkpoint_in_model(kept, folder, dtype="float16", keep_in_fp32_modules=["norm"])
    assert kept.model.norm.weight.dtype == torch.float32 and kept.lm_head.weight.dtype == torch.float16


def test_bin_shards_are_read_without_pickled_code(saved: tuple, tmp_path: Path) -> None:
    reference, _, logits = saved
    reference.save_pretrained(tmp_path, max_shard_size="100KB", safe_serialization=False) \
        if "safe_serialization" in reference.save_pretrained.__code__.co_varnames else None
    if not list(tmp_path.glob("*.bin")):  # transformers 5 writes safetensors only: write .bin shards by hand
        state = reference.state_dict()
        names = sorted(state)
        shards = {f"pytorch_model-0000{i}-of-00002.bin": names[i::2] for i in range(2)}
        for file, keys in shards.items():
            torch.save({k: state[k].clone() for k in keys}, tmp_path / file)
        weight_map = {k: file for file, keys in shards.items() for k in keys}
        (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = load_checkpoint_and_dispatch(empty_llama(), tmp_path, device_map=HALF_ON_DISK,
                                         offload_folder=tmp_path / "offload")
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, logits)
    assert list((tmp_path / "offload").glob("*.dat"))  # .bin weights are copied to the offload format


def test_cpu_offload_disk_offload_and_exact_removal(saved: tuple, tmp_path: Path) -> None:
    reference, _, logits = saved
    for offload in (lambda m: cpu_offload(m, execution_device="cpu"),
                    lambda m: disk_offload(m, tmp_path / "disk", execution_device="cpu")):
        model = copy.deepcopy(reference)
        before = snapshot(model)
        offload(model)
        assert model.model.layers[0].mlp.up_proj.weight.device.type == "meta"
        with torch.no_grad():
            assert torch.equal(model(TOKENS).logits, logits)
        remove_hook_from_module(model, recurse=True)
        assert_same(before, snapshot(model))
        assert model.lm_head.weight is model.model.embed_tokens.weight  # tie restored
    files = os.listdir(tmp_path / "disk")
    assert "index.json" in files and not [f for f in files if f.endswith((".pt", ".pkl", ".bin"))]


def test_remove_hook_restores_a_dispatched_model(saved: tuple, tmp_path: Path) -> None:
    reference, _, logits = saved
    model = copy.deepcopy(reference)
    before = snapshot(model)
    dispatch_model(model, HALF_ON_DISK, offload_dir=tmp_path / "off")
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, logits)
    remove_hook_from_module(model, recurse=True)
    del model.hf_device_map
    assert_same(before, snapshot(model))
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tie restored (the three entry points share it)


def test_cpu_offload_with_hook_chain() -> None:
    """Each model of a chain sends the previous one back when it starts; outputs are unchanged."""
    torch.manual_seed(0)
    first, second = Toy(tie=False), torch.nn.Linear(20, 3)
    x = torch.randint(0, 20, (4, 5))
    expected = second(first(x))
    offloaded: list[str] = []
    first, hook1 = cpu_offload_with_hook(first, "cpu")
    second, hook2 = cpu_offload_with_hook(second, "cpu", prev_module_hook=hook1)
    original = hook1.offload
    hook1.offload = lambda: (offloaded.append("first"), original())[-1]  # record the hand-over
    assert torch.equal(second(first(x)), expected)
    assert offloaded == ["first"]
    hook2.offload()
    hook1.remove()
    hook2.remove()
    assert "_hf_hook" not in first.__dict__ and "_hf_hook" not in second.__dict__


def test_hooks_protocol() -> None:
    class Double(ModelHook):
        def pre_forward(self, module, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
            return tuple(a * 2 for a in args), kwargs

        def post_forward(self, module, output):  # noqa: ANN001, ANN201
            return output + 1

    layer = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    add_hook_to_module(layer, Double())
    add_hook_to_module(layer, Double(), append=True)
    assert torch.allclose(layer(x), layer._hf_hook.hooks[0].post_forward(None, 0) + layer.forward(x * 4) + 1)
    remove_hook_from_module(layer)
    assert "forward" not in layer.__dict__ and not layer._forward_hooks and not layer._forward_pre_hooks
    hook = AlignDevicesHook(execution_device="cpu", io_same_device=True)
    add_hook_to_module(layer, hook)
    assert layer._hf_hook is hook and torch.equal(layer(x), layer.forward(x))


def test_offload_folder_round_trip(tmp_path: Path) -> None:
    state = {"a": torch.randn(3, 4), "b": torch.randn(2).to(torch.bfloat16), "c": torch.tensor(7)}
    offload_state_dict(tmp_path, state)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert sorted(loader) == ["a", "b", "c"]
    for name, value in state.items():
        assert torch.equal(loader[name], value) and loader[name].dtype == value.dtype


# --------------------------------------------------------------------------------------------------------
# Bad input: each a clear error, raised before any weight changes
# --------------------------------------------------------------------------------------------------------


def _unchanged(model: torch.nn.Module, before: dict) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_bad_device_maps_change_nothing(saved: tuple, tmp_path: Path) -> None:
    reference, folder, _ = saved
    model = copy.deepcopy(reference)
    torch.nn.init.zeros_(model.lm_head.weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    unknown = {**HALF_ON_DISK, "model.layers.9": "cpu", "model.layers.2": None}  # None: no device
    with pytest.warns(UserWarning, match=r"\[.model.layers.9.\]"), pytest.raises(ValueError, match="model.layers.2"):
        load_checkpoint_in_model(model, folder, device_map=unknown, offload_folder=tmp_path)
    partial = {k: v for k, v in HALF_ON_DISK.items() if k != "model.layers.2"}
    with pytest.raises(ValueError, match="no device for these tensors: model.layers.2"):
        load_checkpoint_in_model(model, folder, device_map=partial, offload_folder=tmp_path)
    with pytest.raises(ValueError, match="offload_folder is None"):
        load_checkpoint_in_model(model, folder, device_map=HALF_ON_DISK)
    with pytest.raises(ValueError, match="no offload folder"):
        dispatch_model(model, HALF_ON_DISK)
    assert _unchanged(model, before)


def test_transformers_can_switch_the_map_check_off(saved: tuple, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers assigns a no-op to accelerate.big_modeling.check_device_map for models whose
    _no_placement_params stay unmapped; dispatch_model honours it."""
    import overdrive.big_modeling

    reference, _, logits = saved
    partial = {k: v for k, v in HALF_ON_DISK.items() if k != "lm_head"}
    with pytest.raises(ValueError, match="no device for these tensors: lm_head.weight"):
        dispatch_model(copy.deepcopy(reference), partial, offload_dir=tmp_path / "a")
    monkeypatch.setattr(overdrive.big_modeling, "check_device_map", lambda model, device_map: None)
    model = dispatch_model(copy.deepcopy(reference), partial, offload_dir=tmp_path / "b")
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, logits)


def test_mismatched_and_corrupt_checkpoints_change_nothing(saved: tuple, tmp_path: Path) -> None:
    reference, folder, _ = saved
    from transformers import LlamaForCausalLM

    other = LlamaForCausalLM(llama_config(hidden=32))  # every shape differs
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"shapes differ for .*model.embed_tokens.weight: checkpoint "
                                              r"\[1000, 64\], model \[1000, 32\]"):
        load_checkpoint_in_model(other, folder)
    assert _unchanged(other, before)
    deeper = LlamaForCausalLM(llama_config(layers=5))
    with pytest.raises(CheckpointError, match=r"lacks \['model.layers.4"):
        load_checkpoint_in_model(deeper, folder, strict=True)
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in folder.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    last = sorted(broken.glob("*.safetensors"))[-1]
    last.write_bytes(last.read_bytes()[:-100])  # truncated shard
    model = copy.deepcopy(reference)
    torch.nn.init.zeros_(model.lm_head.weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=f"{last.name} is not a valid safetensors file.*truncated"):
        load_checkpoint_in_model(model, broken)
    assert _unchanged(model, before)


def test_layerwise_casting_and_offloaded_state_dict(saved: tuple, tmp_path: Path) -> None:
    from overdrive.big_model import attach_layerwise_casting_hooks, get_state_dict_offloaded_model

    torch.manual_seed(0)
    model = Toy(tie=False)
    x = torch.randint(0, 20, (3, 4))
    rounded = copy.deepcopy(model)
    for layer in rounded.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.to(torch.bfloat16).to(torch.float32)
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32, skip_modules_classes=(torch.nn.Embedding,))
    assert model.blocks[0].fc1.weight.dtype == torch.bfloat16 and model.embed.weight.dtype == torch.float32
    assert torch.equal(model(x), rounded(x))  # computed in fp32 from the bf16-stored weights
    assert model.head.weight.dtype == torch.bfloat16  # back to storage after the forward
    reference, _, _ = saved
    offloaded = disk_offload(copy.deepcopy(reference), tmp_path / "disk", execution_device="cpu")
    state = get_state_dict_offloaded_model(offloaded)
    expected = reference.state_dict()
    assert set(state) >= {k for k in expected if k != "lm_head.weight"}
    assert all(torch.equal(state[k], expected[k]) for k in state)


def test_offload_buffers_preload_and_in_place_loading(saved: tuple) -> None:
    torch.manual_seed(0)
    reference = Toy()
    x = torch.randint(0, 20, (3, 4))
    expected = reference(x)
    model = cpu_offload(copy.deepcopy(reference), "cpu", offload_buffers=True, preload_module_classes=["Block"])
    assert model.scale.device.type == "meta" and model.blocks[0].fc1.weight.device.type == "meta"
    assert "_hf_hook" not in model.blocks[0].fc1.__dict__  # the Block's hook brings in its children's weights
    assert torch.equal(model(x), expected)
    remove_hook_from_module(model, recurse=True)
    assert torch.equal(model.scale, reference.scale)
    # a model that already has storage is loaded in place: same Parameter objects, the checkpoint's values
    llama_reference, folder, logits = saved
    target = copy.deepcopy(llama_reference)
    for param in target.parameters():
        torch.nn.init.zeros_(param)
    before = {name: id(p) for name, p in target.named_parameters()}
    load_checkpoint_in_model(target, folder)
    assert before == {name: id(p) for name, p in target.named_parameters()}
    with torch.no_grad():
        assert torch.equal(target(TOKENS).logits, logits)


class _RunsCode:
    def __reduce__(self):  # noqa: ANN204 - a pickle that would call print() when loaded
        return (print, ("this must never run",))


def test_bin_shards_never_unpickle_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"weight": _RunsCode(), "bias": torch.zeros(4)}, tmp_path / "pytorch_model.bin")
    layer = torch.nn.Linear(4, 4)
    with pytest.raises(CheckpointError, match="could run code"):
        load_checkpoint_in_model(layer, tmp_path)
    assert "must never run" not in capsys.readouterr().out
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match="probably truncated or corrupt"):
        load_checkpoint_in_model(layer, tmp_path)


def test_offloaded_weights_are_released_when_forward_raises() -> None:
    model = cpu_offload(Toy(tie=False), "cpu")
    with pytest.raises(IndexError):
        model(torch.tensor([[99]]))  # out of the embedding's range: raises inside the embedding's forward
    assert model.embed.weight.device.type == "meta"  # the hook still put the weight back
    assert torch.is_grad_enabled()
    assert model(torch.tensor([[1]])).shape == (1, 1, 20)
