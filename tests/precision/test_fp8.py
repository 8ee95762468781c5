"""fp8 training with torchao on one CPU process: overdrive's run equals, bit for bit, the same model converted
by hand with torchao's own API (and trained under the same bf16 autocast); the errors for what cannot run."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.requires("torchao")  # float8 training

from digits import train_step  # noqa: E402
from overdrive import Accelerator  # noqa: E402
from overdrive.config import AORecipeKwargs, TERecipeKwargs  # noqa: E402
from overdrive.precision.fp8 import fp8_unavailable, installed  # noqa: E402
from tests.support.cli import clean_env, overdrive  # noqa: E402

STEPS = 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class Net(nn.Module):
    """First and last linear layers, and one whose width (40) does not divide by 16: these stay nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(24, 32)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.narrow = nn.Linear(32, 40)
        self.out = nn.Linear(40, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(F.relu(self.narrow(x)))


CONVERTED = ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"]


def batches(rank: int = 0, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(batch, 24, generator=g), torch.randn(batch, 8, generator=g)) for _ in range(STEPS)]


def by_hand(model: nn.Module, recipe: str, all_gather: bool = False) -> nn.Module:
    """torchao's own conversion with Accelerate's defaults written out: pad_inner_dim, skip the first and
    last linear layers and the one whose width does not divide by 16."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True,
                                 enable_fsdp_float8_all_gather=all_gather)
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in CONVERTED)


def train_by_hand(model: nn.Module, data: list, autocast: bool = True,
                  after_step: Callable[[], None] | None = None) -> list[torch.Tensor]:
    """Plain PyTorch: AdamW over ``data`` with the forward under bf16 autocast (unless ``autocast=False``)
    and ``after_step()`` after each optimizer step; the loss of each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def train_accelerated(accelerator: Accelerator, model: nn.Module, data: list) -> tuple[nn.Module, list[torch.Tensor]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for x, y in data:
        losses.append(train_step(accelerator, model, optimizer, x, y, F.mse_loss).detach())
    return model, losses


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_run_equals_torchao_by_hand(recipe):
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = Net()
    reference = by_hand(copy.deepcopy(model), recipe)
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(config=recipe)])
    assert accelerator.mixed_precision == "fp8"
    model, losses = train_accelerated(accelerator, model, batches())
    expected = train_by_hand(reference, batches())

    kinds = {name: type(m) for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert [name for name, kind in kinds.items() if kind is Float8Linear] == CONVERTED
    assert {kinds[name] for name in ("inp", "narrow", "out")} == {nn.Linear}
    assert torch.equal(torch.stack(losses), torch.stack(expected)), (losses, expected)
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(mine, theirs), name
    accelerator.free_memory()


@pytest.mark.timeout(120)
def test_fp8_really_changes_the_numbers_and_filter_is_used():
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = Net()
    bf16 = copy.deepcopy(model)
    only_one = AORecipeKwargs(module_filter_func=lambda module, fqn: fqn == "blocks.1.up")
    accelerator = Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[only_one])
    model, fp8_losses = train_accelerated(accelerator, model, batches())
    assert [n for n, m in model.named_modules() if isinstance(m, Float8Linear)] == ["blocks.1.up"]
    accelerator.free_memory()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    _, bf16_losses = train_accelerated(accelerator, bf16, batches())
    assert fp8_losses[0].item() != bf16_losses[0].item()  # the float8 matmul rounds differently from bf16


def test_fp8_errors_name_the_value_and_the_choices():
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()])
    assert "AORecipeKwargs, which needs mixed_precision='fp8' (got 'bf16')" in str(info.value)
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(config="columnwise")])
    assert "'columnwise'" in str(info.value) and "choose from tensorwise, rowwise, rowwise_with_gw_hp" in str(info.value)
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[
            AORecipeKwargs(config="rowwise", enable_fsdp_float8_all_gather=True)])
    assert "needs tensorwise scaling" in str(info.value)
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(), TERecipeKwargs()])
    assert "two fp8 recipes" in str(info.value)
    with pytest.raises(ValueError) as info:
        TERecipeKwargs(fp8_format="E3M4")
    assert "'E3M4'" in str(info.value) and "HYBRID" in str(info.value)


def test_transformer_engine_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    message = str(info.value)
    if installed("transformer_engine"):
        assert "CUDA GPUs only" in message
    else:
        assert "needs transformer_engine, which is not installed" in message
    assert fp8_unavailable("AO", "cpu") is None
    assert "not supported" in fp8_unavailable("MSAMP", "cpu")
    assert "choose from AO, TE" in fp8_unavailable("XYZ", "cpu")
    assert "'mps'" in fp8_unavailable("AO", "mps")


@pytest.mark.timeout(60)
def test_launch_refuses_fp8_it_cannot_run_before_starting_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a worker started')\n")
    config = tmp_path / "fp8.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\nmixed_precision: fp8\nfp8_config:\n  backend: TE\n")
    result = overdrive("launch", "--config_file", str(config), "--cpu", str(script), env=clean_env(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "mixed_precision 'fp8'" in result.stderr and "a worker started" not in result.stderr
