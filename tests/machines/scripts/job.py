"""The many-machines tests' job: a small regression trained with overdrive over a prepared data loader.

``job.py OUT [--steps N] [--sleep S] [--timeout S] [--save-every K] [--fail-at STEP] [--batch B]``

Every rank appends ``STEP <n> <unix time>`` to ``OUT/progress_<rank>`` after each optimizer step and, at the
end, rank 0 writes the weights to ``OUT/weights.pt``. ``--sleep`` slows each step (so a fault can land
mid-run), ``--timeout`` is the process-group timeout (``InitProcessGroupKwargs``). With ``--save-every K`` the
run checkpoints every K steps into ``OUT/project/checkpoints`` (``automatic_checkpoint_naming``) and starts by
``accelerator.load_state()`` when a checkpoint exists: the elastic restart's resume, with nothing else.
``--fail-at STEP`` makes the last rank raise at that step on the first attempt only.
"""

import argparse
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
from tests.support.toy import BATCH, toy_regression  # the repository root is on PYTHONPATH
from torch.utils.data import DataLoader

from overdrive import Accelerator, InitProcessGroupKwargs, ProjectConfiguration

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--timeout", type=float, default=60.0)
parser.add_argument("--save-every", type=int, default=0)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--batch", type=int, default=BATCH)  # the global batch: every world size met must divide it
args = parser.parse_args()
out = Path(args.out)

project = ProjectConfiguration(project_dir=str(out / "project"), automatic_checkpoint_naming=True)
accelerator = Accelerator(project_config=project, kwargs_handlers=[
    InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=args.timeout))])
rank = accelerator.process_index
with open(out / f"where_{rank}", "w") as f:
    f.write(f"{socket.gethostname()} {os.getpid()} {accelerator.num_processes}\n")


data, model, optimizer = toy_regression()
loader = DataLoader(data, batch_size=args.batch // accelerator.num_processes)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)


class Progress:
    """The step count, saved with the checkpoint (Accelerate's ``register_for_checkpointing``)."""

    step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


progress = Progress()
accelerator.register_for_checkpointing(progress)
if args.save_every and (out / "project" / "checkpoints").is_dir() and any((out / "project" / "checkpoints").iterdir()):
    accelerator.load_state()
    accelerator.print(f"RESUMED at step {progress.step}")
start = progress.step
skipped = accelerator.skip_first_batches(loader, start) if start else loader
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
step = start
for x, y in skipped:
    if step >= args.steps:
        break
    if step == args.fail_at and restart == 0 and rank == accelerator.num_processes - 1:
        raise RuntimeError(f"planned failure at step {step}")
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    progress.step = step
    with open(out / f"progress_{rank}", "a") as f:
        f.write(f"STEP {step} {time.time()}\n")
    if args.save_every and step % args.save_every == 0:
        accelerator.save_state()
    time.sleep(args.sleep)
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    torch.save({k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()},
               out / "weights.pt")
print(f"DONE {rank}", flush=True)
sys.exit(0)
