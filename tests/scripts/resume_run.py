"""Shuffled orders and a checkpoint resume in the shape of Accelerate's ``examples/by_feature/checkpointing.py``,
run once with the real Accelerate and once with overdrive (tests/compat/test_resume_fidelity.py compares them).

    python resume_run.py OUT [--alias]

``--alias`` calls overdrive.install_as_accelerate() first (without it ``import accelerate`` is whatever the
process has: the real package, or overdrive under ``overdrive launch --as_accelerate``). Each rank writes
OUT/result_<rank>.json with:

- ``orders``: the sample ids of each batch over 2 epochs of prepared, shuffled loaders: ``shuffle=True``;
  with a ``generator`` seeded (``g.manual_seed(42)``) just before iterating, and the unprepared loader's
  order read the same way (``plain``); ``use_seedable_sampler=True``; ``split_batches=True``;
  ``dispatch_batches=True``;
- ``stateful``: a shuffled loader on torchdata's StatefulDataLoader, its batches after two and a fresh one's
  after ``load_state_dict`` of the state taken there;
- ``train``: 3 epochs of a shuffled loader of 64 samples (batch 4), ``save_state`` at step 5 into OUT/step_5;
- ``resume``: a new run (seeded the same) that loads OUT/step_5, reads ``len(train_dataloader)``, computes the
  starting epoch and the batches to skip as the example does and skips them itself, then trains to the end:
  the batches, the losses and the final weights; once skipping with ``continue`` as the example does
  (``resume["continue"]``), once with ``accelerator.skip_first_batches`` (``resume["skip_first_batches"]``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EPOCHS, SAMPLES, BATCH, SAVE_AT = 3, 64, 4, 5


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--alias", action="store_true")
    return parser.parse_args()


def ids(batch) -> list[int]:
    return [int(v) for v in batch[0].reshape(-1).tolist()]


def dataset(samples: int = SAMPLES):
    import torch
    from torch.utils.data import TensorDataset

    x = torch.arange(samples, dtype=torch.float32).unsqueeze(1)
    return TensorDataset(x, 0.5 * x / samples + 0.1)


def orders() -> dict[str, list[list[list[int]]]]:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from torch.utils.data import DataLoader

    def read(loader, reseed=None) -> list[list[list[int]]]:
        epochs = []
        for _ in range(2):
            if reseed is not None:
                reseed()
            epochs.append([ids(b) for b in loader])
        return epochs

    result = {}
    set_seed(42)
    accelerator = Accelerator()
    result["shuffle"] = read(accelerator.prepare(DataLoader(dataset(24), batch_size=2, shuffle=True)))
    g = torch.Generator()
    loader = accelerator.prepare(DataLoader(dataset(24), batch_size=2, shuffle=True, generator=g))
    result["generator"] = read(loader, lambda: g.manual_seed(42))
    plain_g = torch.Generator()
    plain = DataLoader(dataset(24), batch_size=2, shuffle=True, generator=plain_g)
    result["plain"] = read(plain, lambda: plain_g.manual_seed(42))
    set_seed(42)
    seedable = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    result["seedable"] = read(seedable.prepare(DataLoader(dataset(24), batch_size=2, shuffle=True)))
    set_seed(42)
    split = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    result["split"] = read(split.prepare(DataLoader(dataset(24), batch_size=4, shuffle=True)))
    set_seed(42)
    dispatch = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    result["dispatch"] = read(dispatch.prepare(DataLoader(dataset(24), batch_size=2, shuffle=True)))
    return result


def stateful() -> dict[str, list]:
    """A shuffled loader (seeded generator) on torchdata's StatefulDataLoader: the batches after two, and those a
    fresh loader gives after ``load_state_dict`` of the state taken there."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader

    def make():
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        generator = torch.Generator().manual_seed(5)
        return accelerator.prepare(DataLoader(dataset(37), batch_size=3, shuffle=True, generator=generator))

    first = make()
    run = iter(first)
    head = [ids(next(run)) for _ in range(2)]
    state = first.state_dict()
    rest = [ids(b) for b in run]
    again = make()
    again.load_state_dict(state)
    return {"head": head, "rest": rest, "resumed": [ids(b) for b in again]}


def build():
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    set_seed(42)
    accelerator = Accelerator()
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def step(accelerator, model, optimizer, batch) -> float:
    import torch

    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x / SAMPLES), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.item())


def train(out: Path) -> dict:
    accelerator, model, optimizer, loader = build()
    seen, losses, overall_step = [], [], 0
    for epoch in range(EPOCHS):
        for batch in loader:
            seen.append([epoch, ids(batch)])
            losses.append(step(accelerator, model, optimizer, batch))
            overall_step += 1
            if overall_step == SAVE_AT:
                accelerator.save_state(str(out / f"step_{overall_step}"))
    return {"batches": seen, "losses": losses, "length": len(loader)}


def resume(out: Path, skip: str) -> dict:
    accelerator, model, optimizer, train_dataloader = build()
    path = str(out / f"step_{SAVE_AT}")
    accelerator.load_state(path)
    length = len(train_dataloader)
    # as the example: the epoch and the batches to skip from the folder's name and len(train_dataloader)
    resume_step = int(os.path.basename(path).replace("step_", ""))
    starting_epoch = resume_step // len(train_dataloader)
    resume_step -= starting_epoch * len(train_dataloader)
    seen, losses, overall_step = [], [], 0
    for epoch in range(starting_epoch, EPOCHS):
        active = train_dataloader
        if skip == "skip_first_batches" and epoch == starting_epoch:
            active = accelerator.skip_first_batches(train_dataloader, resume_step)
            overall_step += resume_step
        for index, batch in enumerate(active):
            if skip == "continue" and epoch == starting_epoch and index < resume_step:
                overall_step += 1
                continue
            seen.append([epoch, ids(batch)])
            losses.append(step(accelerator, model, optimizer, batch))
            overall_step += 1
    weights = [float(v) for v in accelerator.unwrap_model(model).weight.reshape(-1).tolist()]
    return {"batches": seen, "losses": losses, "length_after_load": length, "starting_epoch": starting_epoch,
            "overall_step": overall_step, "weights": weights}


def main() -> None:
    args = parse()
    if args.alias:
        import overdrive

        overdrive.install_as_accelerate()
    import accelerate

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = accelerate.Accelerator().state  # reads ACCELERATE_USE_CPU (multi-CPU under torchrun), PartialState not
    result = {"rank": state.process_index, "library": accelerate.Accelerator.__module__.split(".")[0],
              "orders": orders(), "stateful": stateful(), "train": train(out)}
    result["resume"] = {skip: resume(out, skip) for skip in ("continue", "skip_first_batches")}
    (out / f"result_{state.process_index}.json").write_text(json.dumps(result))
    state.wait_for_everyone()


if __name__ == "__main__":
    sys.exit(main())
