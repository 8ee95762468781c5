"""fp8 (torchao) on 2 gloo ranks: with DDP, and with FSDP2 gathering the weights in float8, overdrive's run equals,
bit for bit, the same model converted by hand with torchao's API and wrapped by hand with DDP / fully_shard.
One spawn runs both cases."""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytestmark = [pytest.mark.requires("torchao"), pytest.mark.slow]  # float8 training

from tests.precision.test_fp8 import Net, batches, by_hand, train_accelerated, train_by_hand  # noqa: E402
from tests.support.distributed import run_distributed  # noqa: E402


def _local(tensor: Any) -> Any:
    """A parameter's own values on this rank, plain: the DTensor shard, and torchao's fp8 all-gather wrapper
    unwrapped."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return getattr(tensor, "_tensor", tensor).detach().clone()


def _ddp_case() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from overdrive import Accelerator, AORecipeKwargs

    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(0)
    model = Net()
    reference = by_hand(copy.deepcopy(model), "tensorwise")
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    model, losses = train_accelerated(accelerator, model, batches(rank))
    expected = train_by_hand(DistributedDataParallel(reference), batches(rank))
    mine = [_local(p) for p in accelerator.unwrap_model(model).parameters()]
    theirs = [_local(p) for p in reference.parameters()]
    accelerator.free_memory()
    return {"strategy": type(model).__name__, "losses": torch.equal(torch.stack(losses), torch.stack(expected)),
            "params": all(torch.equal(a, b) for a, b in zip(mine, theirs)), "first": mine[0]}


def _fsdp2_case() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    from overdrive import Accelerator, AORecipeKwargs
    from overdrive.config import FullyShardedDataParallelPlugin

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    reference = by_hand(copy.deepcopy(model), "tensorwise", all_gather=True)
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()],
                              fsdp_plugin=FullyShardedDataParallelPlugin())
    model, losses = train_accelerated(accelerator, model, batches(rank, batch=8))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in reference.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(reference, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32))
    expected = train_by_hand(reference, batches(rank, batch=8), autocast=False,
                             after_step=lambda: precompute_float8_dynamic_scale_for_fsdp(reference))
    mine = [_local(p) for p in model.parameters()]
    theirs = [_local(p) for p in reference.parameters()]
    gathers_fp8 = sum(isinstance(p.to_local(), WeightWithDynamicFloat8CastTensor) for p in model.parameters())
    result = {"losses": torch.equal(torch.stack(losses), torch.stack(expected)),
              "params": all(torch.equal(a, b) for a, b in zip(mine, theirs)),
              "groups": sum(isinstance(m, FSDPModule) for m in model.modules()), "fp8_all_gather": gathers_fp8,
              "loss_values": [round(v.item(), 6) for v in losses]}
    accelerator.free_memory()
    return result


def _both() -> dict[str, Any]:
    return {"ddp": _ddp_case(), "fsdp2": _fsdp2_case()}


@pytest.mark.timeout(240)
def test_fp8_with_ddp_and_fsdp2_equals_torchao_and_torch_by_hand():
    results = run_distributed(_both, 2, timeout=200)
    import torch

    for rank, result in enumerate(results):
        ddp, fsdp2 = result["ddp"], result["fsdp2"]
        assert ddp["strategy"] == "DistributedDataParallel"
        assert ddp["losses"] and ddp["params"], (rank, ddp)
        assert fsdp2["losses"] and fsdp2["params"], (rank, fsdp2)
        assert fsdp2["groups"] == 3  # the two blocks and the root
        assert fsdp2["fp8_all_gather"] == 4  # the four converted weights are gathered in float8
    assert torch.equal(results[0]["ddp"]["first"], results[1]["ddp"]["first"])  # DDP kept the ranks equal
