"""The Accelerator on real gloo process groups, compared with one-process reference computations."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.support.distributed import run_distributed

N_FEATURES = 6


def make_data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, N_FEATURES, generator=g)
    y = (x @ torch.randn(N_FEATURES, 1, generator=g)).squeeze(-1) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(N_FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x).squeeze(-1), y)


def reference_weights(dataset: TensorDataset, batch_sizes: list[int], epochs: int) -> list[torch.Tensor]:
    """Plain PyTorch, one process: one optimizer step per entry of ``batch_sizes``, in data order."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        start = 0
        for size in batch_sizes:
            x, y = dataset[start:start + size]
            start += size
            loss_fn(model, x, y).backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def overdrive_weights(batch_size: int, n: int, epochs: int, steps: int = 1, **kwargs) -> tuple[list, list]:
    from overdrive import Accelerator

    if steps > 1:  # overdrive's exact last window: a window cut short divides by its real length (the mean)
        from overdrive import GradientAccumulationPlugin

        kwargs["gradient_accumulation_plugin"] = GradientAccumulationPlugin(num_steps=steps, exact_last_window=True)
    accelerator = Accelerator(**kwargs)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_data(n), batch_size=batch_size)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    syncs = []
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model, x, y))
                opt.step()
                opt.zero_grad()
                syncs.append(accelerator.sync_gradients)
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    accelerator.free_memory()
    return weights, syncs


def close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-5) -> float:
    worst = max((x - y).abs().max().item() for x, y in zip(a, b))
    assert worst <= atol, f"weights differ by {worst:.3g} > {atol}"
    return worst


def _training_matches_reference() -> dict:
    import torch.distributed as dist

    from overdrive import Accelerator

    out = {}
    # DDP, per-process batch 4, 2 epochs == one process with batch 8 on the same data.
    weights, _ = overdrive_weights(batch_size=4, n=32, epochs=2)
    out["ddp"] = close(weights, reference_weights(make_data(32), [8] * 4, epochs=2))
    # accumulate(4) over 11 global batches of 4, exact_last_window: windows of 4, 4, 3 batches == steps of 16, 16,
    # 12 samples (Accelerate's default divides the last window's losses by 4: the suite's test_grad_sync checks it)
    weights, syncs = overdrive_weights(batch_size=2, n=44, epochs=1, steps=4)
    out["accumulate"] = close(weights, reference_weights(make_data(44), [16, 16, 12], epochs=1))
    assert syncs == [False, False, False, True] * 2 + [False, False, True], syncs
    # split_batches: the loader's batch is the global batch.
    from overdrive.config import DataLoaderConfiguration

    weights, _ = overdrive_weights(batch_size=8, n=32, epochs=1,
                                   dataloader_config=DataLoaderConfiguration(split_batches=True))
    out["split"] = close(weights, reference_weights(make_data(32), [8] * 4, epochs=1))

    # clip_grad_norm_ returns the one-process norm of the whole batch's gradient.
    accelerator = Accelerator()
    model = make_model()
    ref = make_model()
    data = make_data(8)
    loss_fn(ref, *data[:]).backward()
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    model, loader = accelerator.prepare(model, DataLoader(data, batch_size=4))
    for x, y in loader:
        accelerator.backward(loss_fn(model, x, y))
        norm = accelerator.clip_grad_norm_(model.parameters(), 0.1)
    out["norm"] = (norm.item(), expected.item())
    assert abs(norm.item() - expected.item()) < 1e-5
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert abs(clipped.item() - 0.1) < 1e-4

    # trigger: set on one rank, seen on all; cleared after the check.
    if dist.get_rank() == 1:
        accelerator.set_trigger()
    assert accelerator.check_trigger() is True
    assert accelerator.check_trigger() is False
    return out


@pytest.mark.timeout(180)
def test_ddp_accumulation_split_and_clipping_match_one_process():
    results = run_distributed(_training_matches_reference, 2)
    assert results[0]["norm"] == results[1]["norm"]


def _gather_for_metrics(n: int, batch_size: int, split_batches: bool, even_batches: bool) -> list:
    from overdrive import Accelerator
    from overdrive.config import DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split_batches,
                                                                        even_batches=even_batches))
    loader = accelerator.prepare(DataLoader(torch.arange(n), batch_size=batch_size))
    seen = []
    for batch in loader:
        seen.append(accelerator.gather_for_metrics(batch))
        seen.append(accelerator.gather_for_metrics(batch.tolist(), use_gather_object=True))
    tensors = torch.cat(seen[::2]).tolist()
    objects = [i for ids in seen[1::2] for i in ids]
    accelerator.free_memory()
    return [tensors, objects]


def _gather_cases() -> list:
    import os

    world = int(os.environ["WORLD_SIZE"])
    cases = [(10, 3, False, True), (11, 3, False, True), (9, 4, True, True), (10, 3, False, False),
             (11, 4, True, False)] if world == 2 else [(11, 3, False, True), (10, 3, True, True), (7, 2, False, True)]
    return [(case, _gather_for_metrics(*case)) for case in cases]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_gather_for_metrics_returns_the_dataset_in_order(world):
    for case, (tensors, objects) in run_distributed(_gather_cases, world)[0]:
        n = case[0]
        assert tensors == list(range(n)), (case, tensors)
        assert objects == list(range(n)), (case, objects)


def _mixed_precision_and_hooks() -> dict:
    import torch.distributed as dist

    from overdrive import Accelerator, DistributedDataParallelKwargs, LocalSGD

    out = {}
    # bf16: forward runs in bf16 (results differ from fp32), outputs come back fp32, weights stay fp32.
    accelerator = Accelerator(mixed_precision="bf16")
    model = make_model()
    fp32_out = model(make_data(8)[:][0])
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    y = model(make_data(8)[:][0])
    assert y.dtype == torch.float32
    assert 0 < (y - fp32_out).abs().max().item() < 5e-2
    accelerator.backward(y.pow(2).mean())
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    accelerator.free_memory()

    # DDP communication hooks: every rank ends with the same gradient, close to the fp32 average.
    for hook in ("no", "fp16", "bf16", "power_sgd"):
        handler = DistributedDataParallelKwargs(comm_hook=hook, comm_state_option={"matrix_approximation_rank": 1,
                                                                         "start_powerSGD_iter": 2})
        accelerator = Accelerator(kwargs_handlers=[handler])
        model = accelerator.prepare(make_model())
        x, t = make_data(16)[dist.get_rank() * 8:(dist.get_rank() + 1) * 8]
        for _ in range(3):  # powerSGD compresses from its third step on (start_powerSGD_iter=2)
            model.zero_grad()
            accelerator.backward(loss_fn(model, x, t))
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        gathered = accelerator.gather(grads[None])
        assert torch.equal(gathered[0], gathered[1]), hook
        out[hook] = grads
        accelerator.free_memory()

    # LocalSGD: ranks drift apart on their own data, then average every 3 steps.
    accelerator = Accelerator()
    model = make_model()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = make_data(16, seed=dist.get_rank())[:]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3) as local_sgd:
        for step in range(1, 7):
            before = [p.detach().clone() for p in model.parameters()]
            accelerator.backward(loss_fn(model, x, t))
            opt.step()
            opt.zero_grad()
            stepped = [p.detach().clone() for p in model.parameters()]
            local_sgd.step()
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            both = accelerator.gather(flat[None])
            if step % 3 == 0:
                assert torch.allclose(both[0], both[1]), step
                mean = accelerator.reduce(torch.cat([s.flatten() for s in stepped]), reduction="mean")
                assert torch.allclose(flat, mean, atol=1e-6), step
            else:
                assert not torch.allclose(both[0], both[1]), step
            del before
    return out


@pytest.mark.timeout(180)
def test_bf16_comm_hooks_and_local_sgd():
    results = run_distributed(_mixed_precision_and_hooks, 2)
    exact = results[0]["no"]
    assert torch.allclose(results[0]["fp16"], exact, rtol=2e-3, atol=2e-3)
    assert torch.allclose(results[0]["bf16"], exact, rtol=1e-2, atol=1e-2)
    assert not torch.equal(results[0]["bf16"], exact)  # the hook really compressed
    assert not torch.allclose(results[0]["power_sgd"], exact, atol=1e-6)


def _sync_after_forwards_in_no_sync() -> dict:
    """Accelerate's test_sync.py ``test_distributed_sync_multiple_fwd``: three forwards inside ``no_sync``, two
    local backwards, the last backward inside ``trigger_sync_in_backward``: the gradients of the three losses
    are all-reduced there, although the model's ``require_backward_grad_sync`` is True again by then."""
    import torch.distributed as dist

    from overdrive import Accelerator

    accelerator = Accelerator()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = accelerator.prepare(make_model())
    data = make_data(8 * world)
    batches = [data[(3 * rank + i) * 2:(3 * rank + i) * 2 + 2] for i in range(3)]
    losses = []
    for x, y in batches:
        with accelerator.no_sync(model):
            losses.append(loss_fn(model, x, y))
    for loss in losses[:-1]:
        accelerator.backward(loss)
    with accelerator.trigger_sync_in_backward(model):
        accelerator.backward(losses[-1])
    grads = [p.grad.clone() for p in model.parameters()]
    # plain PyTorch, one process: the sum of every rank's three losses, divided by the world size
    reference = make_model()
    for r in range(world):
        for i in range(3):
            x, y = data[(3 * r + i) * 2:(3 * r + i) * 2 + 2]
            (loss_fn(reference, x, y) / world).backward()
    return {"error": close(grads, [p.grad for p in reference.parameters()])}


@pytest.mark.timeout(180)
def test_trigger_sync_in_backward_after_forwards_in_no_sync():
    for result in run_distributed(_sync_after_forwards_in_no_sync, 2):
        assert result["error"] < 1e-5
