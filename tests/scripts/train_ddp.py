"""Train a small model with overdrive.Accelerator; print what the worker received and whether ranks agree.

Prints, from every rank: ``CONFIG {json}`` (the launch config it received and its settings) and, at the
end, ``RESULT {json}`` with the world size and the largest weight difference between ranks.
Flags: ``--fail-rank R`` raises on rank R; ``--kill-rank R`` SIGKILLs rank R; ``--fail-first-attempt``
raises on rank 1 while TORCHELASTIC_RESTART_COUNT is 0; ``--stamp`` prints ``FIRST_STEP <unix time>``.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch

from overdrive import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--kill-rank", type=int, default=None)
parser.add_argument("--fail-first-attempt", action="store_true")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--stamp", action="store_true")
args = parser.parse_args()


def say(line: str) -> None:
    # one write per line: ranks share the launcher's stdout, and print() may split text and newline
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


accelerator = Accelerator()
rank = accelerator.process_index
say("CONFIG " + json.dumps({
    "rank": rank, "world": accelerator.num_processes, "mixed_precision": accelerator.mixed_precision,
    "gradient_accumulation_steps": accelerator.gradient_accumulation_steps, "device": str(accelerator.device),
    "launch_config": json.loads(os.environ.get("OVERDRIVE_LAUNCH_CONFIG") or "{}"),
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
    "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
}))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.Generator().manual_seed(1234 + rank)  # every rank its own data: only DDP keeps weights equal
x = torch.randn(64, 8, generator=data)
y = x.sum(dim=1, keepdim=True)

for step in range(args.steps):
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 0 and args.stamp:
        say(f"FIRST_STEP {time.time():.6f}")
    if step == 2 and rank == args.fail_rank:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    if step == 2 and rank == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 2 and args.fail_first_attempt and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        raise RuntimeError("deliberate failure on the first attempt")

weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
everyone = accelerator.gather(weights[None])
say("RESULT " + json.dumps({"rank": rank, "world": accelerator.num_processes,
                           "spread": (everyone - everyone[0]).abs().max().item(), "loss": loss.item()}))
sys.exit(0)
