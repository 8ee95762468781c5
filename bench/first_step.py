"""The script bench/launch_time.py launches: one DDP training step, then the wall-clock time of it."""

import sys
import time

import torch

from overdrive import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(32, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
loss = model(torch.randn(8, 32)).pow(2).mean()
accelerator.backward(loss)
optimizer.step()
sys.stdout.write(f"FIRST_STEP {accelerator.process_index} {time.time():.6f}\n")
sys.stdout.flush()
