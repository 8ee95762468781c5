"""The training run behind ``overdrive test``: a tiny regression with ``overdrive.Accelerator``.

Each rank trains on its share of the data; the script checks that the loss fell and that every rank ends
with the same weights, and rank 0 writes the outcome as JSON to the path given as its one argument.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from overdrive.accelerator import Accelerator


def main(result_path: str) -> int:
    started = time.perf_counter()
    accelerator = Accelerator()
    # (gloo's exit-time abort is handled where the process group is made: runtime/process_group.py)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)

    data = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    mine = slice(accelerator.process_index, None, accelerator.num_processes)
    x, y = x[mine].to(accelerator.device), y[mine].to(accelerator.device)

    losses = []
    for _ in range(60):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())

    weights = torch.cat([p.detach().float().flatten() for p in accelerator.unwrap_model(model).parameters()])
    everyone = accelerator.gather(weights[None])
    spread = (everyone - everyone[0]).abs().max().item()
    fell = losses[-1] < 0.5 * losses[0]
    result = {
        "ok": fell and spread == 0.0, "loss_first": losses[0], "loss_last": losses[-1], "loss_fell": fell,
        "weight_spread": spread, "num_processes": accelerator.num_processes, "device": str(accelerator.device),
        "backend": accelerator.state.backend, "mixed_precision": accelerator.mixed_precision,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if accelerator.is_main_process:
        with open(result_path, "w") as f:
            json.dump(result, f)
    accelerator.wait_for_everyone()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
