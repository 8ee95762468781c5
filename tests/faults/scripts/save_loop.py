"""One process saving ``--saves`` checkpoints into ``FOLDER`` in a row (a sweep's job); prints OK at the end."""

import sys

import torch

from overdrive import Accelerator

folder, saves = sys.argv[1], int(sys.argv[2])
accelerator = Accelerator()
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
for _ in range(saves):
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    accelerator.save_state(folder)
    accelerator.load_state(folder)
print("OK", flush=True)
