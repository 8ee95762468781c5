"""An Accelerate-style overdrive training loop inside Ray Train's ``TorchTrainer`` (2 CPU workers).

``ray_train_job.py OUT [--steps N]``: starts a local Ray instance of 2 CPUs, trains a small regression in
each worker's ``train_loop_per_worker`` with ``overdrive.Accelerator`` (global batch 32, SGD) and writes
``OUT/ray_result.json`` (what each worker saw, and the loss of every step, averaged over the workers) and
``OUT/weights.pt`` (rank 0's weights at the end). Ray Train has already made the process group when the loop
starts; the Accelerator must adopt it, not make another.

Then, in the same Ray instance, a second run whose rank 1 hangs (sleeps) before step 2's backward while rank 0
waits in DDP's all-reduce, with a process-group timeout of ``--hang_timeout`` seconds: the run must end with
overdrive's hang report. ``OUT/hang_result.json`` holds the error ``fit()`` raised (its text: the workers'
tracebacks), when rank 1 began to hang and when ``fit()`` returned.
"""

import argparse
import json
import time
from pathlib import Path

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from overdrive import Accelerator
    from tests.support.toy import BATCH, toy_regression  # the repository root is on PYTHONPATH

    context = ray.train.get_context()
    made_by_ray = dist.is_initialized()
    group = dist.distributed_c10d._get_default_group() if made_by_ray else None
    accelerator = Accelerator()
    data, model, optimizer = toy_regression()
    loader = DataLoader(data, batch_size=BATCH // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (inputs, targets) in enumerate(loader):
        if step >= config["steps"]:
            break
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())  # the global batch's loss
    seen = {"rank": accelerator.process_index, "ray_rank": context.get_world_rank(),
            "world": accelerator.num_processes, "ray_world": context.get_world_size(),
            "local_rank": accelerator.local_process_index, "ray_local_rank": context.get_local_rank(),
            "device": str(accelerator.device), "made_by_ray": made_by_ray,
            "same_group": dist.distributed_c10d._get_default_group() is group,
            "model": type(model).__name__}
    everyone = accelerator.gather_for_metrics([seen], use_gather_object=True)
    if accelerator.is_main_process:
        out = Path(config["out"])
        torch.save({k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()},
                   out / "weights.pt")
        (out / "ray_result.json").write_text(json.dumps({"workers": everyone, "losses": losses}))
    ray.train.report({"loss": losses[-1]})


def hang_loop_per_worker(config: dict) -> None:
    import torch

    from overdrive import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(5):
        if step == 2 and accelerator.process_index == 1:
            (Path(config["out"]) / "hang_at").write_text(str(time.time()))
            time.sleep(300)  # the hung rank: never reaches the all-reduce of this step
        loss = model(torch.randn(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def run_hang(out: Path, timeout_s: int) -> None:
    """The second run: rank 1 hangs; what ``fit()`` raised goes to ``OUT/hang_result.json``."""
    trainer = TorchTrainer(hang_loop_per_worker, train_loop_config={"out": str(out)},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           torch_config=TorchConfig(timeout_s=timeout_s),
                           run_config=RunConfig(storage_path=str(out / "ray_results"), name="overdrive_hang",
                                                failure_config=FailureConfig(max_failures=0)))
    error = None
    try:
        result = trainer.fit()
        error = result.error
    except Exception as exc:  # noqa: BLE001 - Ray Train raises the workers' failure from fit()
        error = exc
    ended = time.time()
    hang_at = float((out / "hang_at").read_text()) if (out / "hang_at").exists() else None
    (out / "hang_result.json").write_text(json.dumps({"error": None if error is None else str(error),
                                                      "error_type": type(error).__name__, "hang_at": hang_at,
                                                      "ended": ended}))
    print("RAY TRAIN HANG RUN DONE", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hang_timeout", type=int, default=0, help="then the hang run, with this timeout (0: none)")
    args = parser.parse_args()
    # a Ray instance of this test's own (address="local": never one the machine already runs), small
    # (its processes inherit this environment: PYTHONPATH, and OMP_NUM_THREADS which Ray sets to 1 anyway)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20)
    trainer = TorchTrainer(train_loop_per_worker, train_loop_config={"out": args.out, "steps": args.steps},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=str(Path(args.out) / "ray_results"), name="overdrive"))
    result = trainer.fit()
    if result.error is None:
        print("RAY TRAIN DONE", flush=True)
        if args.hang_timeout:
            run_hang(Path(args.out), args.hang_timeout)
    ray.shutdown()
    if result.error is not None:
        raise result.error


if __name__ == "__main__":
    main()
