"""An Accelerate-style overdrive training loop inside Ray Train's ``TorchTrainer`` (2 CPU workers).

``ray_train_job.py OUT [--steps N]``: starts a local Ray instance of 2 CPUs, trains a small regression in
each worker's ``train_loop_per_worker`` with ``overdrive.Accelerator`` (global batch 32, SGD) and writes
``OUT/ray_result.json`` (what each worker saw, and the loss of every step, averaged over the workers) and
``OUT/weights.pt`` (rank 0's weights at the end). Ray Train has already made the process group when the loop
starts; the Accelerator must adopt it, not make another.
"""

import argparse
import json
from pathlib import Path

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    # a Ray instance of this test's own (address="local": never one the machine already runs), small
    # (its processes inherit this environment: PYTHONPATH, and OMP_NUM_THREADS which Ray sets to 1 anyway)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20)
    trainer = TorchTrainer(train_loop_per_worker, train_loop_config={"out": args.out, "steps": args.steps},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=str(Path(args.out) / "ray_results"), name="overdrive"))
    result = trainer.fit()
    ray.shutdown()
    if result.error is not None:
        raise result.error
    print("RAY TRAIN DONE", flush=True)


if __name__ == "__main__":
    main()
