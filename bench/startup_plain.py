"""The plain-PyTorch script bench/startup.py times: import, model, optimizer, loader (DDP and a
DistributedSampler under torchrun), one training step, then the wall-clock and CPU times of it."""

import atexit
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch_imported = time.process_time()  # the same code before this point in both scripts

distributed = "WORLD_SIZE" in os.environ
if distributed:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    atexit.register(time.sleep, 0.1)  # gloo's threads may still hold the last collective's work at a fast exit
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 10, (1024,)))
sampler = DistributedSampler(data) if distributed else None
loader = DataLoader(data, batch_size=64, shuffle=sampler is None, sampler=sampler)
x, y = next(iter(loader))
loss = F.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
rank = dist.get_rank() if distributed else 0
sys.stdout.write(f"FIRST_STEP {rank} {time.time():.6f} {time.process_time():.6f} {torch_imported:.6f} "
                 f"{os.getpid()}\n")
sys.stdout.flush()
if os.environ.get("STARTUP_BENCH_EXIT_AT_FIRST_STEP") == "1":  # bench/startup_instructions.py counts to here
    os._exit(0)
