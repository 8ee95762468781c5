"""The overdrive script bench/startup.py times: the same as startup_plain.py, written for overdrive (import,
Accelerator(), prepare(model, optimizer, loader), one step), then the wall-clock and CPU times of it."""

import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch_imported = time.process_time()  # the same code before this point in both scripts

from overdrive import Accelerator  # noqa: E402 - after the stamp: its import is what is measured

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 10, (1024,)))
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=64, shuffle=True))
for x, y in loader:
    with accelerator.accumulate(model):
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    break
sys.stdout.write(f"FIRST_STEP {accelerator.process_index} {time.time():.6f} {time.process_time():.6f} {torch_imported:.6f} "
                 f"{os.getpid()}\n")
sys.stdout.flush()
if os.environ.get("STARTUP_BENCH_EXIT_AT_FIRST_STEP") == "1":  # bench/startup_instructions.py counts to here
    os._exit(0)
