"""Train and save the same checkpoint folder over and over (2 layers + AdamW, ~10 MB a save); each
published save is announced as ``SAVED <step>`` so the killer knows which step the checkpoint holds."""

import sys

import torch

from overdrive import Accelerator

folder = sys.argv[1]
async_save = "--async" in sys.argv  # then SAVED is printed once the save is published (the next call waited)
torch.manual_seed(0)
accelerator = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
step = 0
while True:
    step += 1
    model(torch.randn(4, 512)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if async_save:
        previous = accelerator.step - 1
        accelerator.save_state(folder, async_save=True)  # waits for the previous one first
        if previous:
            print(f"SAVED {previous}", flush=True)
    else:
        accelerator.save_state(folder)
        print(f"SAVED {accelerator.step}", flush=True)
