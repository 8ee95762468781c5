"""Collectives of tensors that carry autograd history (what transformers' Trainer gathers: losses and logits
computed with grad enabled) work in any grad mode, on 2 processes, and give plain values."""

from __future__ import annotations

from tests.support.distributed import run_distributed


def _collect_with_history() -> dict:
    import torch

    from overdrive import Accelerator
    from overdrive.helpers.ops import gather, pad_across_processes, reduce

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    weight = torch.ones(3, requires_grad=True)
    out: dict = {}
    for mode, context in (("grad", torch.enable_grad), ("no_grad", torch.no_grad), ("inference", torch.inference_mode)):
        with torch.enable_grad():
            value = weight * (rank + 1)  # has a grad_fn
            uneven = (weight[: rank + 1] * 2)
        with context():
            out[mode] = {
                "gather": gather(value).tolist(),
                "gather_0d": gather(value.sum()).tolist(),
                "uneven": gather(uneven).tolist(),
                "metrics": accelerator.gather_for_metrics(value).tolist(),
                "sum": reduce(value, "sum").tolist(),
                "mean": reduce(value.sum(), "mean").item(),
                "pad": pad_across_processes(uneven).tolist(),
                "requires_grad": gather(value).requires_grad or reduce(value, "sum").requires_grad,
            }
    value.sum().backward()  # the inputs' own graph is untouched
    out["grad"]["weight_grad"] = weight.grad.tolist()
    return out


def test_gather_reduce_pad_of_tensors_with_history_on_two_processes():
    ranks = run_distributed(_collect_with_history, 2)
    for mode in ("grad", "no_grad", "inference"):
        for rank, result in enumerate(ranks):
            got = result[mode]
            assert got["gather"] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
            assert got["gather_0d"] == [3.0, 6.0]
            assert got["uneven"] == [2.0, 2.0, 2.0]
            assert got["metrics"] == got["gather"]
            assert got["sum"] == [3.0, 3.0, 3.0]
            assert got["mean"] == 4.5
            assert got["pad"] == [2.0, 2.0, 2.0][: rank + 1] + [0.0] * (1 - rank)
            assert got["requires_grad"] is False
    assert [r["grad"]["weight_grad"] for r in ranks] == [[1.0] * 3, [2.0] * 3]
