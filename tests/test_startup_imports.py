"""A one-process start loads only what it uses (issue 15's first-step target, bench/startup.py).

Import time is mostly module count. These tests run ``Accelerator()``, ``prepare()`` and one step in a fresh interpreter
and check ``sys.modules``: what a plain one-process run does not use (the process group and its watchdog,
the parallelism transforms, the dispatching loader, the plugins' settings modules, checkpointing) must not be
there. No timing: the figures are measured by bench/startup.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from overdrive import Accelerator

accelerator = Accelerator()
after_init = set(sys.modules)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.AdamW(model.parameters())
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=4, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    break
print(json.dumps({"after_init": sorted(after_init), "after_step": sorted(sys.modules),
                  "loader": type(loader).__name__}))
"""

#: torch modules a plain script's first step loads only through the optimizer (torch 2.13's AdamW imports
#: dynamo and with it FSDP and DTensor): Accelerator() must not load them before that
TORCH_NOT_AT_INIT = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor",
                     "torch.distributed.checkpoint")
#: what a one-process run with no plugin, no transform and no save does not use
NOT_AFTER_FIRST_STEP = (
    "torch.distributed.checkpoint",  # a plain first step does not load it either
    "overdrive.runtime.process_group", "overdrive.runtime.watchdog",  # no process group to join
    "overdrive.transforms.fully_shard", "overdrive.transforms.tensor_parallel",
    "overdrive.transforms.activation_checkpointing", "overdrive.transforms.compile",
    "overdrive.transforms.blocks", "overdrive.transforms.context_parallel",
    "overdrive.data.dispatch",  # a map-style dataset is sharded, not dispatched
    "overdrive.strategies.deepspeed.config", "overdrive.strategies.deepspeed.settle", "overdrive.config.megatron",
    "overdrive.config.fp8",
    # the settings of strategies and plugins not asked for: each costs its dataclasses' generated methods
    "overdrive.config.fsdp", "overdrive.config.parallelism", "overdrive.config.pipeline",
    "overdrive.resolve.sharded_settings", "overdrive.resolve.fault_tolerance", "packaging.version",
    "overdrive.compat.table", "overdrive.checkpoint", "overdrive.tracking", "overdrive.precision.fp8",
)


def _run_one_process(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OVERDRIVE_", "ACCELERATE_", "FSDP_",
                                "PARALLELISM_CONFIG_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_"))}
    env["OVERDRIVE_CONFIG_FILE"] = str(tmp_path / "no-config.yaml")  # no default config file
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_one_process_start_loads_only_what_it_uses(tmp_path):
    seen = _run_one_process(tmp_path)
    assert seen["loader"] == "DataLoaderShard"  # the loader was prepared (sharded), not passed through
    assert "overdrive.data.prepare" in seen["after_step"]  # the check below watches the right process
    loaded_at_init = [m for m in TORCH_NOT_AT_INIT if m in seen["after_init"]]
    assert loaded_at_init == [], f"Accelerator() loaded {loaded_at_init}"
    loaded = [m for m in NOT_AFTER_FIRST_STEP if m in seen["after_step"]]
    assert loaded == [], f"a one-process first step loaded {loaded}, which it does not use"


#: what ``import overdrive`` must leave for later: torch, every layer that does work, optional libraries
NOT_AT_IMPORT_LAYERS = ("accelerator", "big_model", "checkpoint", "cli", "data", "helpers", "launchers", "precision",
                        "resolve", "runtime", "strategies", "tracking", "training", "transforms")
OPTIONAL_LIBRARIES = ("accelerate", "deepspeed", "megatron", "mlflow", "tensorboard", "torchao", "torchft",
                      "transformer_engine", "transformers", "wandb")


def test_import_overdrive_loads_no_torch_no_working_layer_and_no_optional_library():
    # the served-paths finder (compat/paths.py) installs at `import overdrive`: a base class from importlib.abc
    # would pull in importlib.resources and tempfile before anything was used
    code = "import sys, json; import overdrive; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "overdrive.compat.paths" in loaded  # the check below watches a process that imported overdrive
    heavy = {"importlib.abc", "importlib.resources", "tempfile", "torch"}
    assert not loaded & heavy, sorted(loaded & heavy)
    layers = sorted(m for m in loaded if m.startswith("overdrive.") and m.split(".")[1] in NOT_AT_IMPORT_LAYERS)
    assert layers == [], f"import overdrive loaded {layers}"
    optional = sorted(m for m in loaded if m.split(".")[0] in OPTIONAL_LIBRARIES)
    assert optional == [], f"import overdrive loaded {optional}"
