"""``gather_for_metrics`` over whole epochs with ``DataLoaderConfiguration(even_batches=False)``, in many loop
shapes, run once with the real Accelerate and once with overdrive (tests/compat/test_gather_uneven.py compares
them).

    python gather_uneven_run.py OUT [--alias]

``--alias`` calls overdrive.install_as_accelerate() first. Each rank writes OUT/result_<rank>.json with, for
every shape ``"<data>,<samples>,<batch>"`` (data: ``map`` for a list, ``dispatch`` for a list with
``dispatch_batches=True``, ``stream`` for an iterable dataset without a length, not dispatched), ``[gathered, sizes]``: the
samples ``gather_for_metrics`` returned over the epoch and every process's batch sizes. Where the processes'
batches do not line up (a different number, or different sizes at one step), a loop that gathers cannot run on
Accelerate (its collectives do not match), so the gathers run only on overdrive and only where every process
has a batch; otherwise ``gathered`` is ``"not run"``. ``warnings`` counts the warnings about samples that
cannot be dropped, ``short`` those about a process whose loop ended before the others' last gathers.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    """Samples 0..n-1 with no length."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def epoch(accelerator, kind: str, n: int, batch: int, library: str) -> list:
    data = Stream(n) if kind == "stream" else list(range(n))
    loader = accelerator.prepare(DataLoader(data, batch_size=batch))
    sizes = [len(b) for b in loader]
    every: list = [None] * accelerator.num_processes
    dist.all_gather_object(every, sizes)
    lined_up = all(s == every[0] for s in every)
    if not lined_up and (library == "accelerate" or not all(every)):
        return ["not run", every]
    gathered = []
    for b in loader:
        gathered += accelerator.gather_for_metrics(b).tolist()
    return [gathered, every]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--alias", action="store_true")
    args = parser.parse_args()
    if args.alias:
        import overdrive

        overdrive.install_as_accelerate()
    import accelerate
    from accelerate.utils import DataLoaderConfiguration

    library = accelerate.Accelerator.__module__.split(".")[0]
    shapes: dict[str, list] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kind, dispatch in (("map", None), ("dispatch", True), ("stream", False)):
            config = DataLoaderConfiguration(even_batches=False, dispatch_batches=dispatch)
            accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
            for n in range(1, 10):
                for batch in (1, 2, 3):
                    shapes[f"{kind},{n},{batch}"] = epoch(accelerator, kind, n, batch, library)
            accelerator.free_memory()
    count = sum("cannot be dropped" in str(w.message) for w in caught)
    short = sum("batch(es) fewer than the longest" in str(w.message) for w in caught)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank = accelerator.process_index
    result = {"rank": rank, "library": library, "shapes": shapes, "warnings": count, "short": short}
    (out / f"result_{rank}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
