"""A DDP job whose rank 1 stops joining collectives at step 2 (it sleeps) while rank 0 waits in all-reduce."""

import time

import torch

from overdrive import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(5):
    if step == 2 and accelerator.process_index == 1:
        print(f"HANG_AT {time.time()}", flush=True)
        time.sleep(600)  # the hung rank: never reaches the all-reduce of this step
    loss = model(torch.randn(8, 4)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
print("finished", accelerator.process_index, flush=True)
