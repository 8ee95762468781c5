"""Zero-copy CPU weights (overdrive.big_model.loading + safetensors_io + mapped_files): a weight loaded to the
CPU of an empty model stays in the checkpoint file's copy-on-write mapping, as with the real Accelerate;
writing to it never reaches the file; the model computes what a copied one does; and a file truncated under
a live mapping raises an error naming it, where the real Accelerate's process dies of SIGBUS."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import overdrive.big_model
from overdrive.big_model import load_checkpoint_and_dispatch, load_checkpoint_in_model, load_state_dict
from tests.big_model.big_model_helpers import llama, llama_config

pytestmark = pytest.mark.requires("transformers")  # builds the Llama models

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")
TOKENS = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """An untied Llama saved as several safetensors shards."""
    model = llama(tie=False)
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder, max_shard_size="300KB")
    assert len(list(folder.glob("*.safetensors"))) > 1
    return model, folder


def empty_llama(library: Any = overdrive.big_model) -> torch.nn.Module:
    """The test Llama (untied) with no storage, built under ``library.init_empty_weights()``."""
    from transformers import LlamaForCausalLM

    with library.init_empty_weights():
        model = LlamaForCausalLM(llama_config(tie=False))
    return model.eval()


def file_mappings(folder: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of files under ``folder`` (from /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip().startswith(str(folder)):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((start, end))
    return ranges


def mapped_fraction(model: torch.nn.Module, folder: Path) -> float:
    ranges = file_mappings(folder)
    params = list(model.parameters())
    return sum(any(a <= p.data_ptr() < b for a, b in ranges) for p in params) / len(params)


def digest(folder: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        sha.update(path.read_bytes())
    return sha.hexdigest()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_cpu_weights_stay_in_the_file_mapping_like_accelerate(saved: tuple) -> None:
    import accelerate  # the real package (no alias in this process)

    _, folder = saved
    theirs = accelerate.load_checkpoint_and_dispatch(empty_llama(accelerate), str(folder), device_map={"": "cpu"})
    ours = load_checkpoint_and_dispatch(empty_llama(), folder, device_map={"": "cpu"})
    assert mapped_fraction(theirs, folder) == 1.0  # the reference: Accelerate leaves every weight mapped
    assert mapped_fraction(ours, folder) == 1.0
    shard = sorted(folder.glob("*.safetensors"))[0]
    for state in (accelerate.utils.load_state_dict(str(shard)), load_state_dict(shard)):
        ranges = file_mappings(folder)
        assert all(any(a <= t.data_ptr() < b for a, b in ranges) for t in state.values())
    plain = empty_llama()
    load_checkpoint_in_model(plain, folder)  # no device map: the CPU
    assert mapped_fraction(plain, folder) == 1.0
    # a weight that must be cast is copied (nothing to share), the others stay mapped
    cast = empty_llama()
    load_checkpoint_in_model(cast, folder, dtype=torch.bfloat16, keep_in_fp32_modules=["lm_head"])
    assert cast.lm_head.weight.dtype == torch.float32 and 0 < mapped_fraction(cast, folder) < 1
    # a model that already has storage is loaded into it (identity kept, as load_state_dict does)
    materialized = llama(tie=False, seed=5)
    weight = materialized.lm_head.weight
    load_checkpoint_in_model(materialized, folder)
    assert materialized.lm_head.weight is weight and mapped_fraction(materialized, folder) == 0.0


def test_writes_copy_the_page_not_the_file(saved: tuple) -> None:
    reference, folder = saved
    before = digest(folder)
    model = load_checkpoint_and_dispatch(empty_llama(), folder, device_map={"": "cpu"})
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(TOKENS).logits.square().mean().backward()
    optimizer.step()  # every weight written
    assert digest(folder) == before
    assert not torch.equal(model.model.norm.weight, reference.model.norm.weight)  # the writes took effect
    again = load_checkpoint_and_dispatch(empty_llama(), folder, device_map={"": "cpu"})
    for (name, mine), theirs in zip(again.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(mine, theirs), name


def test_zero_copy_model_computes_what_a_copied_one_does(saved: tuple, tmp_path: Path) -> None:
    reference, folder = saved
    mapped = load_checkpoint_and_dispatch(empty_llama(), folder, device_map={"": "cpu"})
    copied = llama(tie=False, seed=3)
    load_checkpoint_in_model(copied, folder)  # into the model's own storage: a copy
    assert mapped_fraction(copied, folder) == 0.0
    generate = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(mapped(TOKENS).logits, copied(TOKENS).logits)
        assert torch.equal(mapped(TOKENS).logits, reference(TOKENS).logits)
        assert torch.equal(mapped.generate(TOKENS, **generate), copied.generate(TOKENS, **generate))
    # disk offload reads the same file mapping lazily: same tokens again
    half = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
            "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    offloaded = load_checkpoint_and_dispatch(empty_llama(), folder, device_map=half, offload_folder=tmp_path)
    with torch.no_grad():
        assert torch.equal(offloaded.generate(TOKENS, **generate), copied.generate(TOKENS, **generate))


TRUNCATE = """
import json, os, sys, shutil, torch
library = {library!r}
extra = {{}}
if library == "accelerate":
    import accelerate as library
else:
    from overdrive import big_model as library
    extra = {{"offload_in_place": True}}  # disk weights mapped from the checkpoint's shards, as the guard expects
sys.path.insert(0, {here!r})
from big_model_helpers import llama_config
from transformers import LlamaForCausalLM
folder, tokens = {folder!r}, torch.tensor([[1, 2, 3, 4]])
with library.init_empty_weights():
    model = LlamaForCausalLM(llama_config(tie=False)).eval()
model = library.load_checkpoint_and_dispatch(model, folder, device_map={device_map},
                                             offload_folder=os.path.join(folder, "offload"), **extra)
with torch.no_grad():
    before = model(tokens).logits
# replaced by a new file (what a fresh download or a careful writer does): the old data stays readable
shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
for shard in shards:
    path = os.path.join(folder, shard)
    os.link(path, path + ".mapped")  # the file the model maps, under a second name
    shutil.copy(path, path + ".new")
    with open(path + ".new", "r+b") as file:
        file.seek(-64, 2)
        file.write(bytes(64))
    os.replace(path + ".new", path)
with torch.no_grad():
    same_after_replace = torch.equal(model(tokens).logits, before)
for shard in shards:  # the mapped file truncated in place under the live mapping
    os.truncate(os.path.join(folder, shard + ".mapped"), 4096)
errors = []
for attempt in range(4):  # a fault per shard mapped for CPU weights, then disk weights refuse to map
    try:
        with torch.no_grad():
            model(tokens)
        errors.append(None)
    except Exception as err:
        errors.append([type(err).__name__, str(err)])
print(json.dumps({{"same_after_replace": same_after_replace, "errors": errors}}))
"""


def run_truncation(library: str, folder: Path, device_map: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(TRUNCATE.format(library=library, here=str(HERE), folder=str(folder),
                                           device_map=device_map))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          timeout=180, env=env)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard is for 64-bit Linux")
def test_truncated_file_under_a_live_mapping_raises_instead_of_crashing(saved: tuple, tmp_path: Path) -> None:
    model, _ = saved
    # the crash, reproduced with the real Accelerate (safetensors' mapping): the process dies of SIGBUS
    model.save_pretrained(tmp_path / "a", max_shard_size="300KB")
    theirs = run_truncation("accelerate", tmp_path / "a", '{"": "cpu"}')
    assert theirs.returncode == -signal.SIGBUS, theirs.stderr[-2000:]
    assert "Bus error" in theirs.stderr
    # overdrive: weights on the CPU (the file mapping) and on disk (mapped at each forward)
    model.save_pretrained(tmp_path / "o", max_shard_size="300KB")
    half = ('{"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu", '
            '"model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}')
    ours = run_truncation("overdrive", tmp_path / "o", half)
    assert ours.returncode == 0, ours.stderr[-3000:]
    out = json.loads(ours.stdout.strip().splitlines()[-1])
    assert out["same_after_replace"]  # a replaced file: the model keeps the data it loaded
    for error in out["errors"]:  # every forward fails, naming the shard
        assert error is not None and error[0] == "MappedFileError", out
        assert str(tmp_path / "o" / "model-0000") in error[1] and "to 4096 bytes" in error[1], error
        assert "reload the model" in error[1], error
    assert "weights were mapped from it (a read at byte" in out["errors"][0][1]  # the guard's SIGBUS
    assert "while its weights were in use" in out["errors"][-1][1]  # the offload hook's new map


def test_a_fault_outside_the_mappings_still_crashes(tmp_path: Path) -> None:
    """The guard takes only its own addresses: a SIGBUS elsewhere goes to the handler that was there before."""
    code = textwrap.dedent(f"""
        import mmap, os, torch
        from overdrive.big_model.safetensors_io import SafetensorsFile
        from safetensors.torch import save_file
        save_file({{"w": torch.ones(4096)}}, {str(tmp_path / "a.safetensors")!r})
        kept = SafetensorsFile({str(tmp_path / "a.safetensors")!r}).view("w")  # installs the guard
        with open({str(tmp_path / "b.bin")!r}, "wb") as file:
            file.write(bytes(65536))
        with open({str(tmp_path / "b.bin")!r}, "rb") as file:
            other = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        os.truncate({str(tmp_path / "b.bin")!r}, 0)
        print("read", other[40000], flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -signal.SIGBUS and "read" not in proc.stdout, (proc.returncode, proc.stderr[-2000:])
