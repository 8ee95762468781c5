"""Accelerate's regional-compilation helpers (``compile_regions`` and its in-place DeepSpeed / FSDP2 forms)
under the alias give what the real Accelerate's give: the same module tree, methods bound to the instance
rebound to the copy, the original model untouched, the same outputs."""

from __future__ import annotations

import pytest

from tests.support.engines import run_function

pytestmark = [pytest.mark.requires("accelerate")]


def _regions(engine: str) -> dict:
    """The same script under ``engine`` ("accelerate": the real one, "overdrive": the alias), in a fresh process."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    from types import MethodType
    from typing import Any

    import torch
    from accelerate.utils import compile_regions, compile_regions_fsdp2
    from accelerate.utils.other import has_repeated_blocks, is_repeated_blocks

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body: Any = torch.nn.Module()
            self.body.blocks = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(4, 2)
            self.tag = "original"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen = (self.tag, type(self.body.blocks[0]).__name__)
            for block in self.body.blocks:
                x = block(x)
            return self.head(x)

    def tree(module: torch.nn.Module) -> list[tuple[str, str]]:
        return [(name, type(m).__name__) for name, m in module.named_modules()]

    torch.manual_seed(0)
    model = Model()
    model.forward = MethodType(lambda self, x: type(self).forward(self, x) * 2, model)
    x = torch.randn(3, 4)
    expected = model(x)
    del model.seen  # so that whether the copy's forward reaches the original shows
    before = tree(model)
    compiled: Any = compile_regions(model, backend="eager")
    compiled.tag = "copy"
    out = compiled(x)
    plain = compile_regions(Model(), backend="eager")
    in_place = Model()
    returned = compile_regions_fsdp2(in_place, backend="eager")
    return {
        "tree": tree(compiled), "original_tree_kept": tree(model) == before,
        "forward_rebound": compiled.__dict__["forward"].__self__ is compiled,
        "seen": compiled.seen, "original_untouched": getattr(model, "seen", None),
        "output_equal": torch.equal(out, expected), "orig_mod": compiled._orig_mod is model,
        "shares_parameters": compiled.head.weight is model.head.weight,
        "plain_has_no_forward": "forward" not in plain.__dict__,
        "fsdp2_same_object": returned is in_place, "fsdp2_tree": tree(in_place),
        "fsdp2_compiled": sorted(n for n, m in in_place.named_modules() if m._compiled_call_impl is not None),
        "repeated": (is_repeated_blocks(model.body.blocks), is_repeated_blocks(model.body),
                     has_repeated_blocks(model), has_repeated_blocks(model.head),
                     is_repeated_blocks(torch.nn.ModuleList())),
    }


def test_compile_regions_matches_accelerate():
    theirs = run_function(_regions, "accelerate")
    ours = run_function(_regions, "overdrive")
    assert ours == theirs
    # what the comparison rests on: the blocks and the head are compiled wrappers, the forward was rebound
    assert ("body.blocks.0", "OptimizedModule") in theirs["tree"] and ("head", "OptimizedModule") in theirs["tree"]
    assert theirs["seen"] == ("copy", "OptimizedModule") and theirs["original_untouched"] is None
    assert theirs["fsdp2_compiled"] == ["body.blocks.0", "body.blocks.1", "head"]
