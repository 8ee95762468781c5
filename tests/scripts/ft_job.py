"""A training loop written for Accelerate, unchanged for fault tolerance (the launch turns it on): AdamW with a
decaying learning rate on a seeded toy regression. Each step appends ``{"pid", "time", "skipped", "loss",
"first", "lr", "scheduler_step"}`` to ``OUT/steps_<group>_<rank>.jsonl``; at the end rank 0 saves the weights
and the optimizer and scheduler states to ``OUT/final_<group>.pt`` and the sample indices an evaluation loop
gathered (``gather_for_metrics``) to ``OUT/evaluated_<group>.json``. ``STEP_SLEEP`` seconds per step give a
test time to act; ``FT_KILL_AT_STEP=N`` kills the launch's processes (SIGKILL) in step N, after its forward:
the other groups lose it mid-step. Once a file ``OUT/end_step`` holds a number N, every group leaves its loop
when its scheduler has stepped N times (a test ends a run a few steps after a relaunched group healed, rather
than after a data set sized for the slowest machine). With ``SAVE_AND_LOAD=1`` the run ends with ``save_state``
into ``OUT/saved_state_<group>``, its weights and optimizer state zeroed, and ``load_state``, before the final
save. The weights and optimizer state saved are whole tensors under FSDP2 too (gathered over the group).

    overdrive launch --ft_lighthouse http://HOST:PORT --ft_replica_group 0 --ft_num_replica_groups 2 ft_job.py OUT
    overdrive launch --use_fsdp --fsdp_version 2 --num_processes 2 --ft_lighthouse ... ft_job.py OUT   # FSDP2 inside
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from overdrive import Accelerator


def problem(samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module, torch.optim.Optimizer,
                                   torch.optim.lr_scheduler.LRScheduler]:
    """The data, model, optimizer and scheduler every process builds (a test builds them too, as its reference)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(samples, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
    return x, y, model, optimizer, scheduler


def _end_step(out: Path) -> int | None:
    path = out / "end_step"  # (a test renames it into place whole)
    return int(path.read_text()) if path.exists() else None


def main() -> None:
    out = Path(sys.argv[1])
    samples, batch = int(os.environ.get("SAMPLES", "256")), int(os.environ.get("BATCH", "4"))
    pause = float(os.environ.get("STEP_SLEEP", "0"))
    x, y, model, optimizer, scheduler = problem(samples)

    accelerator = Accelerator()
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    group = os.environ.get("OVERDRIVE_FT_REPLICA_GROUP", "0")
    log = out / f"steps_{group}_{accelerator.process_index}.jsonl"
    if isinstance(model, FSDPModule):
        _check_the_state_sent_while_gathered(accelerator, model, out / f"sent_{group}_{accelerator.process_index}.json")
    kill_at = int(os.environ.get("FT_KILL_AT_STEP", "-1"))
    for step, (inputs, targets) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if step == kill_at:  # lost mid-step: this step's quorum counts this group, its average never comes
            os.killpg(os.getpgid(0), signal.SIGKILL)
        if os.environ.get("FT_OWN_BACKWARD") == group:  # the script's own backward, not the Accelerator's
            loss.backward()
        else:
            accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        with log.open("a") as f:
            f.write(json.dumps({"pid": os.getpid(), "time": time.time(), "skipped": optimizer.step_was_skipped,
                                "loss": loss.item(), "first": inputs[0, 0].item(),
                                "lr": scheduler.get_last_lr()[0], "scheduler_step": scheduler.last_epoch}) + "\n")
        end = _end_step(out)
        if end is not None and scheduler.last_epoch >= end:
            break
        time.sleep(pause)
    # an evaluation loop: every group gathers its own shards' predictions; over the groups, each sample once
    model.eval()
    evaluation = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10).float().unsqueeze(1)), batch_size=4))
    seen = []
    with torch.no_grad():
        for (index,) in evaluation:
            seen += accelerator.gather_for_metrics(index).flatten().tolist()
    if os.environ.get("SAVE_AND_LOAD"):
        _save_clear_and_load(accelerator, model, optimizer, out / f"saved_state_{group}")
    # whole tensors (a sharded model's and its optimizer's are gathered over the group: every process takes part)
    final = {"weights": _whole(accelerator.unwrap_model(model).state_dict()), "optimizer": _whole(optimizer.state_dict()),
             "scheduler": scheduler.state_dict(), "distributed_type": str(accelerator.distributed_type)}
    if accelerator.is_main_process:
        (out / f"evaluated_{group}.json").write_text(json.dumps(seen))
        torch.save(final, out / f"final_{group}.pt")


def _check_the_state_sent_while_gathered(accelerator: Accelerator, model: Any, path: Path) -> None:
    """The state a healing group would receive, read while the weights are gathered (as in a forward, when
    torchft's quorum thread reads it): this process's shards, and the gathered weights left in place."""
    strategy: Any = accelerator.strategy
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in sharded:  # (each unshards its own parameters only)
        module.unshard()
    sent = strategy.model_state(model)
    in_use = dict(model.named_parameters())
    path.write_text(json.dumps({"sent": {k: type(v).__name__ for k, v in sent.items()},
                                "in_use": {k: type(v).__name__ for k, v in in_use.items()}}))
    for module in sharded:
        module.reshard()


def _whole(value: Any) -> Any:
    """``value`` with each sharded tensor (DTensor) gathered whole."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def _save_clear_and_load(accelerator: Accelerator, model: torch.nn.Module, optimizer: Any, folder: Path) -> None:
    """``save_state``, then the weights and the optimizer's state zeroed, then ``load_state``: what the run saves
    from here on is what the checkpoint gave back."""
    accelerator.save_state(folder)
    with torch.no_grad():
        for tensor in [*model.parameters(), *(v for s in optimizer.state.values() for v in s.values()
                                                if torch.is_tensor(v))]:
            tensor.zero_()
    accelerator.load_state(folder)


if __name__ == "__main__":
    main()
