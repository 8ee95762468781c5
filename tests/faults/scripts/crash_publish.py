"""``crash_publish.py FOLDER VALUE [crash]``: save a Linear(4, 2) filled with VALUE to FOLDER with save_state; with
``crash``, the process dies (``os._exit``, no clean-up) between the two renames of the overwrite: after the old
checkpoint was moved aside, before the new one took its name."""

import os
import sys

import torch

from overdrive import Accelerator
from overdrive.checkpoint import naming

folder, value = sys.argv[1], float(sys.argv[2])
accelerator = Accelerator(cpu=True)
model = accelerator.prepare(torch.nn.Linear(4, 2))
with torch.no_grad():
    for p in model.parameters():
        p.fill_(value)
if sys.argv[3:] == ["crash"]:
    real_replace = os.replace

    def replace(src, dst):
        real_replace(src, dst)
        if os.path.abspath(src) == os.path.abspath(folder):  # the old checkpoint is aside now
            os._exit(9)

    naming.os.replace = replace  # pyright: ignore[reportAttributeAccessIssue]
accelerator.save_state(folder)
print("saved", flush=True)
