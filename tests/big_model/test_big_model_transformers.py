"""transformers' own ``from_pretrained(device_map="auto", max_memory=..., offload_folder=...)`` running on
overdrive's big-model code through ``install_as_accelerate()``: part of a sharded Llama goes to disk, and its
logits and greedy generation equal the model loaded whole. Runs in a fresh interpreter (the alias is
process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.requires("transformers")  # builds the Llama models

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")

SCRIPT = """
import json, sys, torch
import overdrive
overdrive.install_as_accelerate()
sys.path.insert(0, {here!r})
from big_model_helpers import llama
import transformers.integrations.accelerate as integration
from transformers import LlamaForCausalLM

reference = llama()
folder = {folder!r}
reference.save_pretrained(folder, max_shard_size="100KB")
tokens = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(1))
model = LlamaForCausalLM.from_pretrained(folder, device_map="auto", max_memory={{"cpu": 700_000}},
                                         offload_folder=folder + "/offload")
with torch.no_grad():
    same_logits = torch.equal(model(tokens).logits, reference(tokens).logits)
generate = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
first_offloaded = [n for n, d in model.hf_device_map.items() if d == "disk"][0]
hook = model.get_submodule(first_offloaded)._hf_hook
print(json.dumps({{
    "map": model.hf_device_map,
    "dispatch_from": integration.dispatch_model.__module__,
    "hook_class": type(hook).__module__ + "." + type(hook).__name__,
    "same_logits": same_logits,
    "same_generate": torch.equal(model.generate(tokens, **generate), reference.generate(tokens, **generate)),
    "meta_while_idle": all(p.device.type == "meta" for p in model.get_submodule(first_offloaded).parameters()),
}}))
"""


def test_from_pretrained_device_map_auto_with_disk_offload(tmp_path: Path) -> None:
    code = textwrap.dedent(SCRIPT.format(here=str(HERE), folder=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    devices = set(out["map"].values())
    assert devices == {"cpu", "disk"}, out["map"]
    assert out["dispatch_from"] == "overdrive.big_model.dispatch"
    assert out["hook_class"] == "overdrive.big_model.hooks.AlignDevicesHook"
    assert out["same_logits"] and out["same_generate"] and out["meta_while_idle"]
