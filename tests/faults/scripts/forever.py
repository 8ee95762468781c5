"""A job that never ends: each rank writes its pid, then its rank into a heartbeat file every 0.1 s."""

import os
import sys
import time

import torch.distributed as dist

from overdrive import PartialState

state = PartialState()
folder = sys.argv[1]
with open(os.path.join(folder, f"pid_{state.process_index}"), "w") as f:
    f.write(str(os.getpid()))
dist.barrier()
while True:
    time.sleep(0.1)
