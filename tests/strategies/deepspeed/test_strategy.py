"""The DeepSpeed strategy without training processes: what prepare() refuses, the engine files' check; and
one real launch with --use_deepspeed."""

from __future__ import annotations

from pathlib import Path

import pytest

from overdrive import Accelerator, DeepSpeedPlugin
from tests.support.cli import clean_env, overdrive, rank_results


@pytest.mark.requires("deepspeed")
def test_prepare_refuses_what_deepspeed_cannot_build_together():
    import torch
    import torch.distributed as dist

    from overdrive.utils import DummyOptim, DummyScheduler

    assert not dist.is_initialized()  # tests/conftest.py fails a test that leaves one behind
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="prepare\\(\\) got 2 models; DeepSpeed builds one engine per model"):
        acc.prepare(first, second)
    with pytest.raises(ValueError, match="an optimizer or scheduler without its model"):
        acc.prepare(torch.optim.SGD(first.parameters(), lr=0.1))
    dummy = DummyOptim(first.parameters())
    with pytest.raises(ValueError) as info:  # reported before any process group or engine exists
        acc.prepare(first, dummy, DummyScheduler(dummy, total_num_steps=10))
    text = str(info.value)
    assert "DummyOptim stands for the optimizer of the DeepSpeed config, but the config built from the plugin's fields has no" in text
    assert "DummyScheduler stands for the scheduler of the DeepSpeed config" in text
    assert "train_micro_batch_size_per_gpu is \"auto\"" in text
    assert not dist.is_initialized()  # the refusals came before any process group was made
    acc.free_memory()


class Payload:
    """Stands for an object a hostile checkpoint could carry: unpickling it would run its class's code."""


def test_engine_files_referring_to_unknown_globals_are_refused(tmp_path):
    import torch

    from overdrive.strategies.deepspeed.checkpoint import refuse_unknown_globals

    torch.save({"module": {"w": torch.zeros(2)}, "ds_version": "0.19"}, tmp_path / "mp_rank_00_model_states.pt")
    refuse_unknown_globals(tmp_path)  # tensors, dicts and strings only
    torch.save({"extra": Payload()}, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(PermissionError, match=r"Payload.*allow_pickle=True"):
        refuse_unknown_globals(tmp_path)


DS_SCRIPT = """
import json, sys
sys.path.insert(0, EXAMPLES)
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from overdrive import Accelerator, DistributedType
from digits import train_step

acc = Accelerator()
assert acc.distributed_type == DistributedType.DEEPSPEED, acc.distributed_type
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), DataLoader(data, batch_size=4))
losses = []
for _ in range(4):
    for x, y in loader:
        loss = train_step(acc, model, opt, x, y, nn.functional.mse_loss)
        losses.append(acc.gather(loss.detach()[None]).mean().item())
open(f"{sys.argv[1]}/result_{acc.process_index}.json", "w").write(json.dumps({
    "rank": acc.process_index, "world": acc.num_processes, "type": acc.distributed_type.value,
    "stage": model.zero_optimization_stage(), "clip": model.gradient_clipping(),
    "accumulation": model.gradient_accumulation_steps(), "steps": model.global_steps,
    "offload": acc.deepspeed_plugin.get_value("zero_optimization.offload_optimizer.device"),
    "first": sum(losses[:8]) / 8, "last": sum(losses[-8:]) / 8}))
"""


@pytest.mark.requires("deepspeed")
@pytest.mark.deepspeed
@pytest.mark.timeout(180)
def test_use_deepspeed_launch_trains_on_two_processes(tmp_path):
    script = tmp_path / "ds_train.py"
    script.write_text(DS_SCRIPT.replace("EXAMPLES", repr(str(Path(__file__).resolve().parents[3] / "examples"))))
    result = overdrive("launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "2",
                       "--gradient_accumulation_steps", "2", "--gradient_clipping", "0.7",
                       "--offload_optimizer_device", "cpu", "--deepspeed_multinode_launcher", "standard", str(script), str(tmp_path),
                       env=clean_env(tmp_path, DS_LOG_LEVEL="error"), timeout=170)
    for got in rank_results(result, tmp_path):
        assert got["world"] == 2 and got["type"] == "DEEPSPEED" and got["stage"] == 2, got
        assert got["clip"] == 0.7 and got["accumulation"] == 2 and got["offload"] == "cpu", got
        assert got["steps"] == 16 and got["last"] < got["first"], got  # 4 epochs x 8 batches / 2


def test_docs_name_the_benchmark_command():
    text = (Path(__file__).resolve().parents[3] / "docs" / "deepspeed.md").read_text()
    assert "python bench/zero_memory.py" in text
