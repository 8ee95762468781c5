"""Functions for notebook_launcher / debug_launcher tests: importable, so spawned processes can find them."""

import json
import os

import torch


def train(steps: int) -> dict:
    """Train a little with overdrive.Accelerator; return what this rank saw and its final weights."""
    from overdrive import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(accelerator.process_index))
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    everyone = accelerator.gather(weights[None])
    accelerator.wait_for_everyone()
    return {"rank": accelerator.process_index, "world": accelerator.num_processes,
            "mixed_precision": accelerator.mixed_precision, "spread": (everyone - everyone[0]).abs().max().item(),
            "launch_config": json.loads(os.environ.get("OVERDRIVE_LAUNCH_CONFIG") or "{}"),
            "threads": torch.get_num_threads()}


def fail_on_rank_one() -> None:
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank one refuses")
