"""Every ``accelerate`` import and attribute that transformers, PEFT, TRL, diffusers, sentence-transformers,
setfit and lm-eval use (found in their installed source with ``ast``, see tests/scripts/accelerate_usage_scan.py)
resolves under ``overdrive.install_as_accelerate()`` wherever it resolves under the real Accelerate.

The walks run in two fresh interpreters (the real package, the alias), never in the pytest process.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.scripts.accelerate_usage_scan import LIBRARIES, compare, scan, scan_source, walk_all

SRC = str(Path(__file__).resolve().parents[2] / "src")
INSTALLED = [name for name in LIBRARIES if importlib.util.find_spec(name) is not None]


def chain_text(chain: list[list[str]]) -> str:
    return "".join(s[1] if s[0] == "import" else "()" if s[0] == "call" else f".{s[1]}" for s in chain)


def test_the_scanner_finds_imports_bindings_and_attribute_chains():
    source = '''
import accelerate.utils as au
def f():
    try:
        from accelerate.state import PartialState, AcceleratorState as AS
    except ImportError:
        PartialState = None
    PartialState._shared_state
    AS().distributed_type.value
    au.DistributedType.MULTI_GPU
class T:
    def __init__(self):
        from accelerate import Accelerator
        self.acc = Accelerator(mixed_precision="bf16")
    def g(self, trainer):
        self.acc.gradient_state.sync_gradients
        trainer.accelerator.even_batches = False
        getattr(self.acc, "num_processes")
        getattr(self.acc, "maybe", None)
        self.acc.unwrap_model(m).config
        torch.accelerator.current_accelerator().type
'''
    found = {chain_text(chain) for chain, _ in scan_source(source)}
    expected = {"accelerate.utils", "accelerate.state.PartialState", "accelerate.state.AcceleratorState",
                "accelerate.Accelerator", "accelerate.state.PartialState._shared_state",
                "accelerate.state.AcceleratorState().distributed_type.value", "accelerate.utils.DistributedType.MULTI_GPU",
                "accelerate.Accelerator().gradient_state.sync_gradients", "accelerate.Accelerator().even_batches",
                "accelerate.Accelerator().num_processes", "accelerate.Accelerator().unwrap_model"}
    assert expected <= found, expected - found
    # getattr with a default is optional, a method's result is not followed, torch.accelerator is not Accelerate's
    assert not {c for c in found if c.endswith(".maybe") or ".config" in c or "current_accelerator" in c}, found


def test_walking_reports_missing_names_and_stops_at_none():
    walked = walk_all([[["import", "json"], ["attr", "dumps"]], [["import", "json"], ["attr", "no_such_name"]],
                       [["import", "json.decoder"], ["attr", "JSONDecoder"], ["call"], ["attr", "object_hook"],
                        ["attr", "deeper"]],
                       [["import", "no_such_module_anywhere"]]])
    assert [list(w) for w in walked] == [[2, "done"], [1, "missing"], [4, "none"], [0, "missing"]]


@pytest.fixture(scope="module")
def usage() -> tuple[dict[str, list[str]], dict]:
    chains = scan(INSTALLED)
    return chains, compare(chains, SRC)


@pytest.mark.requires("transformers", "accelerate")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_accelerate_name_the_libraries_use_resolves_under_the_alias(usage):
    chains, result = usage
    places = {place.split("/")[0] for where in chains.values() for place in where}
    assert {"transformers", *(p for p in ("peft", "trl", "diffusers", "lm_eval") if p in INSTALLED)} <= places
    assert result["chains"] >= 150 and result["steps_checked"] >= 500, result
    known = {chain_text(json.loads(c)) for c in chains}
    # what each library is known to reach for is among the chains (the scanner still sees them)
    assert {"accelerate.Accelerator().gather_for_metrics", "accelerate.state.PartialState._shared_state",
            "accelerate.utils.DistributedType.DEEPSPEED"} <= known
    if "sentence_transformers" in INSTALLED:  # it sets the property: a new attribute would change nothing
        assert "accelerate.Accelerator().even_batches" in known
    assert not result["gaps"], json.dumps(result["gaps"], indent=1)


BEHAVIOUR = """
import json, sys
if sys.argv[1] == "alias":
    import overdrive
    overdrive.install_as_accelerate()
import torch
from torch import nn
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig

out = {}
for sizes in ({}, {"dp_shard_size": 2}, {"dp_replicate_size": 2, "dp_shard_size": 2}, {"tp_size": 2, "cp_size": 2}):
    pc = ParallelismConfig(**sizes)
    out[str(sizes)] = [pc.cp_backend, pc.sp_size, pc.sp_backend, pc.cp_enabled, pc.sp_enabled, pc.tp_enabled,
                       pc.dp_shard_enabled, pc.dp_replicate_enabled, pc.fsdp_dim_names]
for precision in ("no", "fp16", "bf16"):
    plugin = DeepSpeedPlugin(zero_stage=2)
    plugin.set_mixed_precision(precision)
    out["ds " + precision] = [plugin.deepspeed_config[d]["enabled"] for d in ("fp16", "bf16")]
plugin = DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
try:
    plugin.set_mixed_precision("fp16")
    out["ds conflict"] = "accepted"
except ValueError:
    out["ds conflict"] = "refused"
plugin.set_deepspeed_weakref()
from transformers.integrations import is_deepspeed_zero3_enabled
out["weakref zero3"] = is_deepspeed_zero3_enabled()
plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_batch_size": "auto"})
plugin.set_deepspeed_weakref()
out["weakref zero3 on"] = is_deepspeed_zero3_enabled()
from transformers.integrations import unset_hf_deepspeed_config
unset_hf_deepspeed_config()

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
class Net(nn.Module):
    _no_split_modules = ["Block"]
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 200)
model = Net()
for name, kwargs in (("transformer", {"auto_wrap_policy": "transformer_based_wrap"}),
                     ("size", {"auto_wrap_policy": "size_based_wrap", "min_num_params": 1000}),
                     ("none", {"auto_wrap_policy": "no_wrap"})):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, **kwargs)
    plugin.set_auto_wrap_policy(model)
    policy = plugin.auto_wrap_policy
    out["wrap " + name] = [n for n, m in model.named_modules() if m is not model and policy is not None
                           and policy(module=m, recurse=False, nonwrapped_numel=sum(p.numel() for p in m.parameters()))]
plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
plugin.set_mixed_precision("bf16")
first = plugin.mixed_precision_policy
plugin.set_mixed_precision(torch.float16)
kept = plugin.mixed_precision_policy is first
plugin.set_mixed_precision(torch.float16, override=True)
policy = plugin.mixed_precision_policy
out["fsdp mp"] = [str(first.param_dtype), str(first.reduce_dtype), kept, str(policy.param_dtype), type(policy).__name__]
accelerator = Accelerator(cpu=True)
loader = torch.utils.data.DataLoader(list(range(4)))
out["ulysses"] = accelerator.deepspeed_ulysses_dl_adapter(loader, model) is loader
print(json.dumps(out))
"""


@pytest.mark.requires("accelerate", "transformers")
def test_the_names_the_scan_found_missing_behave_as_accelerate(tmp_path):
    """ParallelismConfig's context/sequence-parallel fields and properties, DeepSpeedPlugin.set_mixed_precision
    and set_deepspeed_weakref, FullyShardedDataParallelPlugin.set_auto_wrap_policy and set_mixed_precision,
    Accelerator.deepspeed_ulysses_dl_adapter: the same results on the real Accelerate and the alias."""
    import os
    import subprocess
    import sys

    script = tmp_path / "behaviour.py"
    script.write_text(BEHAVIOUR)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "PARALLELISM_CONFIG_"))},
           "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
    results = {}
    for engine in ("real", "alias"):
        proc = subprocess.run([sys.executable, str(script), engine], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["alias"] == results["real"]
    assert results["real"]["wrap transformer"] == ["blocks.0", "blocks.1"] and results["real"]["ulysses"]


def test_sequence_parallel_and_unknown_backends_are_refused_by_name():
    from overdrive import Accelerator
    from overdrive.config import ParallelismConfig

    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2, cp_backend="ring"))
    text = str(info.value)
    assert "sp_size=2" in text and "Ulysses" in text and "cp_size" in text
    assert "cp_backend='ring'" in text and "'torch'" in text
