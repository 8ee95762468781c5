"""torch.compile caches across runs and ranks (docs/compile.md): a second run finds the first run's inductor
artifacts in ``TORCHINDUCTOR_CACHE_DIR``, every rank of a job shares that folder, and torch's mega-cache
(``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``) carries them to an empty folder.

Judged by inductor's and AOTAutograd's cache counters, not by time. The model is one bias-free linear layer:
inductor compiles it to calls of extern matmul kernels, without a C++ kernel to build (~5 s cold here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.distributed import run_distributed

pytestmark = pytest.mark.slow


def _compile_once(cache_dir: str) -> dict[str, int]:
    """Compile and run forward + backward of a fresh model with ``cache_dir`` as the inductor cache; the
    cache counters of that compilation."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch
    from torch._dynamo.utils import counters

    class Net(torch.nn.Module):  # a user class: torch.compile skips torch.nn's own containers' frames
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 4, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)

    torch._dynamo.reset()
    counters.clear()
    model = Net()
    model.compile()
    model(torch.randn(4, 8)).sum().backward()
    return {**{f"inductor.{k}": v for k, v in counters["inductor"].items() if "cache" in k},
            **{f"aot.{k}": v for k, v in counters["aot_autograd"].items() if "cache" in k}}


def _first_run_then_mega_cache(first_dir: str, empty_dir: str) -> dict[str, Any]:
    import torch

    first = _compile_once(first_dir)
    artifacts = torch.compiler.save_cache_artifacts()
    blob = artifacts[0] if artifacts else b""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = empty_dir  # what a fresh job on another machine does:
    torch.compiler.load_cache_artifacts(blob)  # load the saved bytes into its empty cache folder ...
    moved = _compile_once(empty_dir)  # ... then compile
    return {"first": first, "mega_cache": moved, "blob_bytes": len(blob)}


def _second_run(cache_dir: str) -> dict[str, int]:
    return _compile_once(cache_dir)


def _regional_run(cache_dir: str) -> dict[str, Any]:
    """Regional compilation of four identical blocks through ``prepare()``: the compile counters, and the
    largest difference of the output and the gradients from the same model run eagerly."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import copy

    import torch
    from torch._dynamo.utils import counters

    from overdrive import Accelerator, TorchDynamoPlugin

    class Block(torch.nn.Module):  # bias-free linear: extern matmul kernels forward and backward, no C++ build
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    reference = Net()
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="inductor",
                                                                        use_regional_compilation=True))
    model = accelerator.prepare(copy.deepcopy(reference))
    counters.clear()
    # the input requires grad, as a block's input does after an embedding: one graph serves every block
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out, expected = model(x), reference(x)
    out.square().sum().backward()
    expected.square().sum().backward()
    worst = max([(out - expected).abs().max().item()]
                + [(a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), reference.parameters())
                   if a.grad is not None and b.grad is not None])
    return {"graphs": counters["stats"]["unique_graphs"], "recompiles": sum(counters["recompiles"].values()),
            "grads": sum(p.grad is not None for p in model.parameters()), "worst": worst,
            **{f"inductor.{k}": v for k, v in counters["inductor"].items() if "cache" in k},
            **{f"aot.{k}": v for k, v in counters["aot_autograd"].items() if "cache" in k}}


@pytest.mark.timeout(300)
def test_second_run_and_every_rank_hit_the_inductor_cache(tmp_path: Path):
    shared, empty = str(tmp_path / "inductor"), str(tmp_path / "empty")
    (result,) = run_distributed(_first_run_then_mega_cache, 1, shared, empty, timeout=240)
    assert result["first"].get("inductor.fxgraph_cache_miss", 0) > 0, result  # a cold cache: compiled
    assert result["first"].get("inductor.fxgraph_cache_hit", 0) == 0, result
    assert result["blob_bytes"] > 0
    assert result["mega_cache"].get("inductor.fxgraph_cache_hit", 0) > 0, result
    assert result["mega_cache"].get("inductor.fxgraph_cache_miss", 0) == 0, result
    assert any(Path(empty).rglob("*")), "the mega-cache was not written into the empty cache folder"

    ranks = run_distributed(_second_run, 2, shared, timeout=240)  # a second run, two ranks, one folder
    for rank, counts in enumerate(ranks):
        assert counts.get("inductor.fxgraph_cache_hit", 0) > 0, (rank, counts)
        assert counts.get("inductor.fxgraph_cache_miss", 0) == 0, (rank, counts)
        assert counts.get("aot.autograd_cache_hit", 0) > 0, (rank, counts)


@pytest.mark.timeout(300)
def test_regional_compile_builds_one_forward_and_backward_for_all_blocks_and_a_second_run_reuses_them(
        tmp_path: Path):
    cache = str(tmp_path / "inductor")
    (first,) = run_distributed(_regional_run, 1, cache, timeout=240)
    # four blocks, one dynamo graph, inductor compiled one forward and one backward graph (both cache misses)
    assert first["graphs"] == 1 and first["recompiles"] == 0 and first["grads"] == 4, first
    assert first.get("inductor.fxgraph_cache_miss", 0) == 2 and first.get("inductor.fxgraph_cache_hit", 0) == 0, first
    assert first["worst"] < 1e-5, first  # the compiled blocks compute what the eager ones do
    (second,) = run_distributed(_regional_run, 1, cache, timeout=240)  # a new process, the same cache folder
    assert second.get("inductor.fxgraph_cache_hit", 0) == 2 and second.get("inductor.fxgraph_cache_miss", 0) == 0, second
    assert second.get("aot.autograd_cache_hit", 0) == 1 and second["worst"] < 1e-5, second
