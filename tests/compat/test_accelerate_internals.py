"""Accelerate's internals that scripts call on their own (checkpoint files, launch preparation, the DeepSpeed
engine wrapper, the FSDP2 steps of prepare()) behave as Accelerate 1.16.0's: compared with the real package in
its own interpreter where they need no process group, and on 2 gloo ranks for the FSDP2 steps."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.parallel import make_model

SRC = str(Path(__file__).resolve().parents[2] / "src")


_INTERNALS = r"""
import json, os, sys, tempfile, warnings
import torch
side = sys.argv[1]
if side == "alias":
    import overdrive
    overdrive.install_as_accelerate()
from accelerate import PartialState
from accelerate.checkpointing import load_custom_state, save_custom_state
from accelerate.utils import DeepSpeedEngineWrapper, PrepareForLaunch, TorchTensorParallelConfig
from accelerate.utils.fsdp_utils import (fsdp2_canonicalize_names, fsdp2_switch_optimizer_parameters,
                                         get_fsdp2_grad_scaler)
PartialState()  # Accelerate's checkpoint helpers log through its process-aware logger, which needs it
out = {}
names = {"_orig_mod.block._checkpoint_wrapped_module.weight": 1, "a._orig_mod.b": 2, "plain.bias": 3}
out["names"] = fsdp2_canonicalize_names(names)
folder = sys.argv[2]
source, target = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)
save_custom_state(source, folder, index=2)
load_custom_state(target, folder, index=2)
out["custom"] = [sorted(os.listdir(folder)), all(torch.equal(a, b) for a, b in
                                                 zip(source.state_dict().values(), target.state_dict().values()))]
model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
fsdp2_switch_optimizer_parameters(optimizer, {p.data_ptr: q for p, q in zip(model.parameters(), other.parameters())})
out["switched"] = all(p is q for p, q in zip(optimizer.param_groups[0]["params"], other.parameters()))
try:
    fsdp2_switch_optimizer_parameters(optimizer, {})
    out["missing"] = "no error"
except KeyError:
    out["missing"] = "KeyError"
scaler = get_fsdp2_grad_scaler(enabled=False)
out["scaler"] = [type(scaler).__module__ + "." + type(scaler).__name__, scaler.is_enabled()]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    config = TorchTensorParallelConfig(enable_async_tp=True)
out["tp"] = [config.enable_async_tp, [str(w.message) for w in caught]]
class Engine:  # records what the wrapper asks of a DeepSpeed engine, in order
    def __init__(self):
        self.calls = []
    def set_gradient_accumulation_boundary(self, is_boundary):
        self.calls.append(f"boundary {is_boundary}")
    def backward(self, loss, **kwargs):
        self.calls.append(f"backward {float(loss)} {sorted(kwargs)}")
    def step(self):
        self.calls.append("step")
    def get_global_grad_norm(self):
        return torch.tensor(2.5)
engine = Engine()
wrapper = DeepSpeedEngineWrapper(engine)
wrapper.backward(torch.tensor(1.0), sync_gradients=False)
wrapper.backward(torch.tensor(2.0), retain_graph=True)
out["engine"] = [engine.calls, wrapper.get_global_grad_norm()]
seen = {}
os.environ.update(NPROC="2", NODE_RANK="1")
PrepareForLaunch(lambda x: seen.update(x=x, **{k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "FORK_LAUNCHED")}),
                 distributed_type="MULTI_CPU")(1, "arg")
out["launch"] = seen
print(json.dumps(out))
"""


@pytest.mark.requires("accelerate")
def test_accelerate_internals_scripts_call_behave_as_the_real_release(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = {}
    for side in ("real", "alias"):
        folder = tmp_path / side
        folder.mkdir()
        proc = subprocess.run([sys.executable, "-c", _INTERNALS, side, str(folder)], capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs["alias"] == runs["real"]
    assert runs["real"]["custom"] == [["custom_checkpoint_2.pkl"], True] and runs["real"]["switched"]


def _fsdp2_steps() -> dict:
    """The FSDP2 steps one by one, as a script that builds its own FSDP2 model calls them."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from overdrive import Accelerator
    from overdrive.config import FullyShardedDataParallelPlugin
    from overdrive.utils.fsdp_utils import (
        ensure_weights_retied,
        fsdp2_apply_ac,
        fsdp2_load_full_state_dict,
        fsdp2_prepare_auto_wrap_policy,
        fsdp2_prepare_model,
    )

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(fsdp_plugin=plugin)
    reference = make_model(seed=0)
    full_sd = {k: v.clone() for k, v in reference.state_dict().items()}
    policy = fsdp2_prepare_auto_wrap_policy(plugin, reference)
    assert policy is not None
    wrapped_by_policy = sorted(name for name, module in reference.named_modules() if policy(module))
    size_policy = fsdp2_prepare_auto_wrap_policy(
        FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=10**9), reference)
    assert size_policy is not None
    model = fsdp2_apply_ac(accelerator, make_model(seed=5))
    model = fsdp2_prepare_model(accelerator, model)
    fsdp2_load_full_state_dict(accelerator, model, full_sd if dist.get_rank() == 0 else {})
    loaded = accelerator.get_state_dict(model)  # the full weights, on the main process
    same = dist.get_rank() != 0 or all(torch.equal(loaded[k], full_sd[k]) for k in full_sd)

    class Tied(torch.nn.Module):  # an embedding tied to the head, as transformers' models tie them
        _tied_weights_keys = ["head.weight"]

        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False)
            self.head.weight = self.embed.weight

    def init(module: torch.nn.Module) -> torch.nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.ones_like(param, device="cpu")))
        return module

    tied = Tied()
    retie = ensure_weights_retied(init, tied, torch.device("cpu"))
    for module in (tied.embed, tied.head):
        retie(module)
    return {"policy": wrapped_by_policy, "size_policy_wraps": any(size_policy(m) for m in reference.modules()),
            "sharded_blocks": sum(isinstance(m, FSDPModule) for m in model.modules()), "loaded": same,
            "still_tied": tied.embed.weight is tied.head.weight}


@pytest.mark.slow
def test_fsdp2_steps_of_prepare_run_on_their_own_on_two_ranks():
    results = run_distributed(_fsdp2_steps, 2, timeout=300)
    reference = make_model(seed=0)
    blocks = sorted(name for name, module in reference.named_modules() if type(module).__name__ == "Block")
    for result in results:
        assert result["policy"] == blocks and blocks
        assert not result["size_policy_wraps"]
        assert result["sharded_blocks"] >= len(blocks) and result["loaded"] and result["still_tied"]


_CHECKPOINT = r"""
import json, os, random, sys
import torch
side, mode, folder = sys.argv[1:4]
if side == "alias":
    import overdrive
    overdrive.install_as_accelerate()
from accelerate import PartialState
from accelerate.checkpointing import load_accelerator_state, save_accelerator_state
PartialState()

def objects(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scheduler.step()
    return model, optimizer, scheduler

if mode == "save":
    model, optimizer, scheduler = objects(0)
    random.seed(7)
    torch.manual_seed(7)
    save_accelerator_state(folder, [model.state_dict()], [optimizer], [scheduler], [], 0, 12)
    print(json.dumps({"files": sorted(os.listdir(folder))}))
else:
    model, optimizer, scheduler = objects(1)
    out = load_accelerator_state(folder, [model], [optimizer], [scheduler], [], 0)
    print(json.dumps({"returned": out, "weights": [round(v, 6) for v in model.weight.flatten().tolist()],
                      "lr": scheduler.get_last_lr(), "adam_step": float(optimizer.state[model.weight]["step"]),
                      "draws": [random.random(), torch.rand(1).item()]}))
"""


def _checkpoint_process(side: str, mode: str, folder: str) -> dict:
    """_CHECKPOINT as ``python -c`` runs it: one process, none of the launch variables that run_distributed
    gives a rank."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "ACCELERATE_USE_CPU"):
        os.environ.pop(key, None)
    sys.argv = ["-c", side, mode, folder]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_CHECKPOINT, "<_CHECKPOINT>", "exec"), {"__name__": "__main__"})
    return json.loads(printed.getvalue().strip().splitlines()[-1])


def _checkpoint_run(side: str, mode: str, folder: Path) -> dict:
    """One new process (forked from the tests' fork server: torch is imported, Accelerate and overdrive not)."""
    return run_distributed(_checkpoint_process, 1, side, mode, str(folder), timeout=300)[0]


@pytest.mark.slow  # five processes, each importing Accelerate or overdrive
@pytest.mark.requires("accelerate")
def test_accelerator_state_files_are_written_and_read_as_accelerates(tmp_path):
    """Each side reads what the other wrote: the same files, weights, optimizer and scheduler states, step and
    random numbers."""
    for side in ("real", "alias"):
        (tmp_path / side).mkdir()  # save_accelerator_state writes into an existing folder, as Accelerate's
    written = {side: _checkpoint_run(side, "save", tmp_path / side) for side in ("real", "alias")}
    assert written["alias"] == written["real"]
    assert written["real"]["files"] == ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin"]
    read = {(reader, writer): _checkpoint_run(reader, "load", tmp_path / writer)
            for reader, writer in (("alias", "real"), ("real", "alias"), ("real", "real"))}
    assert read[("alias", "real")] == read[("real", "real")] == read[("real", "alias")]
    assert read[("real", "real")]["returned"] == {"step": 12}


_DEEPSPEED_LAUNCH = r"""
import json, sys
side = sys.argv[1]
if side == "alias":
    import overdrive
    overdrive.install_as_accelerate()
from accelerate.commands.launch import launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env
out = {}
for name, flags in (("pdsh", ["--num_machines", "2", "--machine_rank", "1", "--deepspeed_hostfile", "hosts"]),
                    ("nossh", ["--num_machines", "2", "--machine_rank", "1", "--deepspeed_multinode_launcher", "nossh",
                               "--deepspeed_inclusion_filter", "host1"]),
                    ("one machine", ["--num_machines", "1"])):
    args = launch_command_parser().parse_args(["--use_deepspeed", "--mixed_precision", "no", "--num_processes", "4",
                                               "--main_process_ip",
                                               "10.0.0.1", "--main_process_port", "29600", *flags, "train.py", "--lr",
                                               "1"])
    args.deepspeed_fields_from_accelerate_config = []  # what launch's validation adds before calling it
    cmd, env = prepare_deepspeed_cmd_env(args)
    out[name] = {"cmd": cmd, "nproc_per_node": getattr(args, "nproc_per_node", None),
                 "launcher": args.deepspeed_multinode_launcher, "use_deepspeed": env.get("ACCELERATE_USE_DEEPSPEED")}
print(json.dumps(out))
"""


@pytest.mark.requires("accelerate")
def test_deepspeed_launch_command_is_accelerates():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = {}
    for side in ("real", "alias"):
        proc = subprocess.run([sys.executable, "-c", _DEEPSPEED_LAUNCH, side], capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs["alias"] == runs["real"]
    assert runs["real"]["pdsh"]["cmd"][:2] == ["deepspeed", "--hostfile"] and runs["real"]["one machine"]["cmd"] is None


def test_deepspeed_cpu_optimizer_follows_the_torch_optimizer():
    from overdrive.compat.internals import deepspeed_cpu_optimizer_spec

    params = [torch.nn.Parameter(torch.ones(2))]
    assert deepspeed_cpu_optimizer_spec(torch.optim.AdamW(params, lr=0.1, weight_decay=0.2)) == (
        "deepspeed.ops.adam:DeepSpeedCPUAdam", {"lr": 0.1, "weight_decay": 0.2, "adamw_mode": True})
    assert deepspeed_cpu_optimizer_spec(torch.optim.Adam(params, lr=0.3))[1]["adamw_mode"] is False
    assert deepspeed_cpu_optimizer_spec(torch.optim.Adagrad(params, lr=0.4)) == (
        "deepspeed.ops.adagrad:DeepSpeedCPUAdagrad", {"lr": 0.4, "weight_decay": 0})
