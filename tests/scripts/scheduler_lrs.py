"""The learning rates a prepared LR scheduler gives, run once with the real Accelerate and once with overdrive
(tests/compat/test_scheduler_parity.py compares them).

    python scheduler_lrs.py OUT [--alias]

``--alias`` calls overdrive.install_as_accelerate() first (without it ``import accelerate`` is whatever the
process has: the real package, or overdrive under ``overdrive launch --as_accelerate``). Each rank writes
OUT/result_<rank>.json: ``{setting: [lr after each scheduler.step()]}`` for a LambdaLR and a OneCycleLR,
with and without ``split_batches`` / ``step_scheduler_with_optimizer``, inside gradient accumulation (with
and without ``adjust_scheduler``), and with steps the optimizer skipped (``_is_overflow``, as fp16 overflow).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

STEPS = 12


def run(setting: dict, skip: frozenset[int] = frozenset()) -> list[float]:
    """The lr after each of STEPS loop iterations of ``setting`` (Accelerator keywords, ``one_cycle``,
    ``accumulate``/``adjust``); the optimizer reports a skipped step on the iterations in ``skip``."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin

    options = {k: v for k, v in setting.items() if k == "step_scheduler_with_optimizer"}
    if setting.get("split_batches"):  # (Accelerate 1.15 ignores Accelerator(split_batches=...))
        options["dataloader_config"] = DataLoaderConfiguration(split_batches=True)
    if setting.get("accumulate"):
        options["gradient_accumulation_plugin"] = GradientAccumulationPlugin(
            num_steps=setting["accumulate"], adjust_scheduler=setting.get("adjust", True))
    accelerator = Accelerator(**options)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    if setting.get("one_cycle"):
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=setting.get("total", 8))
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 / (1 + n))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for i in range(STEPS):
        with accelerator.accumulate(model):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            optimizer._is_overflow = i in skip
            scheduler.step()
            optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return lrs


SETTINGS = {
    "lambda": {},
    "lambda_split": {"split_batches": True},
    "lambda_not_with_optimizer": {"step_scheduler_with_optimizer": False},
    "one_cycle": {"one_cycle": True},
    "one_cycle_split": {"one_cycle": True, "split_batches": True, "total": STEPS},  # (one step a call)
    "lambda_accumulate": {"accumulate": 3},
    "lambda_accumulate_no_adjust": {"accumulate": 3, "adjust": False},
    "one_cycle_accumulate": {"one_cycle": True, "accumulate": 2},
}


def main() -> None:
    """Write this rank's learning rates for every setting (and with skipped steps) to OUT."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--alias", action="store_true")
    args = parser.parse_args()
    if args.alias:
        import overdrive

        overdrive.install_as_accelerate()
    import accelerate

    result: dict = {"library": accelerate.Accelerator.__module__.split(".")[0]}
    for name, setting in SETTINGS.items():
        result[name] = run(setting)
        result[name + "_skipped"] = run(setting, skip=frozenset({1, 4, 5}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"result_{os.environ.get('RANK', '0')}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
