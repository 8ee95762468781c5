"""The one model path: hooks in one registry under every strategy, compilation (whole and regional) and
activation checkpointing with the same meaning everywhere, typed strategy settings, the plan's isolation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from overdrive import (
    Accelerator,
    ActivationCheckpointingKwargs,
    FullyShardedDataParallelPlugin,
    TorchDynamoPlugin,
)
from overdrive.training.state import AcceleratorState
from overdrive.transforms.compile import compiled_in_place
from tests.support.parallel import accelerated_losses, make_model, reference_losses, worst


def overdrive_hooks(model: nn.Module) -> int:
    """Forward hooks left on any module of ``model`` (the model path adds none besides its registry's)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def is_checkpointed(module: nn.Module) -> bool:
    from torch.distributed._composable.contract import _get_registry

    return "checkpoint" in (_get_registry(module) or {})


@pytest.mark.parametrize("fsdp", [False, True], ids=["single", "fsdp2-one-process"])
def test_unwrap_without_fp32_wrapper_and_free_memory_remove_every_hook(fsdp: bool):
    kwargs = {"fsdp_plugin": FullyShardedDataParallelPlugin()} if fsdp else {}
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", **kwargs)
    model = accelerator.prepare(make_model())
    assert overdrive_hooks(model) == 2 and len(accelerator.hooks) == 2
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert overdrive_hooks(plain) == 0 and len(accelerator.hooks) == 0
    other = accelerator.prepare(make_model())
    assert overdrive_hooks(other) == 2
    accelerator.free_memory()
    assert overdrive_hooks(other) == 0 and len(accelerator.hooks) == 0


def test_meta_model_is_refused_by_the_one_path_and_leaves_no_hook():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    with torch.device("meta"):
        model = make_model()
    with pytest.raises(ValueError, match=r"parameters on the meta device \(embed.weight"):
        accelerator.prepare(model)
    assert len(accelerator.hooks) == 0 and accelerator.prepared.models == []


def test_a_prepare_that_fails_after_the_precision_hooks_leaves_none_behind():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[ActivationCheckpointingKwargs()])
    model = nn.Sequential(nn.Linear(4, 4))  # no repeated blocks to checkpoint: refused after autocast went on
    with pytest.raises(ValueError, match="activation_checkpointing found no blocks in Sequential"):
        accelerator.prepare(model)
    assert overdrive_hooks(model) == 0 and len(accelerator.hooks) == 0 and accelerator.prepared.models == []

    def fails(model: nn.Module) -> None:
        raise RuntimeError("a transform of one's own failed")

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    accelerator.strategy.extra_transforms.append(fails)
    model = make_model()
    with pytest.raises(RuntimeError, match="a transform of one's own failed"):
        accelerator.prepare(model)
    assert overdrive_hooks(model) == 0 and len(accelerator.hooks) == 0 and accelerator.prepared.models == []


def test_activation_checkpointing_and_regional_compile_on_one_process_match_plain_pytorch():
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ActivationCheckpointingKwargs()],
                              dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    out = accelerated_losses(accelerator, 8, 3)
    assert worst(out["losses"], reference_losses(8, 3)) < 1e-5
    model = out["model"]
    assert all(is_checkpointed(block) for block in model.layers)
    assert all(compiled_in_place(block) for block in model.layers)
    assert not compiled_in_place(model)  # regional: the blocks, not the whole model
    assert accelerator.unwrap_model(model) is model  # compiled in place: the names and checkpoints stay


def test_whole_model_compile_is_in_place_and_dynamo_backend_means_the_same():
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    model = accelerator.prepare(make_model())
    assert type(model).__name__ == "TinyTransformer" and compiled_in_place(model)
    assert accelerator.plan.transforms.compile.backend == "eager"
    assert list(model.state_dict()) == list(make_model().state_dict())  # no "_orig_mod." prefixes


def test_whole_model_compile_with_mixed_precision_trains_like_plain_autocast():
    """The autocast hooks around the whole model stay outside the graph (traced, their pair used to fail:
    'autocast' object has no attribute 'prev')."""
    torch._dynamo.reset()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_backend="eager")
    out = accelerated_losses(accelerator, 8, 3)
    assert compiled_in_place(out["model"])
    assert worst(out["losses"], reference_losses(8, 3, dtype=torch.bfloat16)) < 1e-5


def test_compile_reaches_models_and_blocks_of_torchs_own_classes():
    """torch.compile skips the frames of torch's own code: Module.compile on an nn.Sequential of torch layers
    (or on nn.TransformerEncoderLayer blocks) used to compile nothing, silently."""
    from torch._dynamo.utils import counters

    from overdrive.transforms.compile import is_compiled

    torch._dynamo.reset()
    counters.clear()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_backend="eager")
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)))
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    out = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x)
    assert counters["stats"]["unique_graphs"] == 1 and is_compiled(model)
    assert out.dtype == torch.float32 and torch.equal(out, expected.float())  # the autocast hooks still apply
    assert list(model.state_dict()) == list(reference.state_dict())

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
                                        for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    torch._dynamo.reset()
    counters.clear()
    regional = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    torch.manual_seed(0)
    encoder = regional.prepare(Encoder())
    torch.manual_seed(0)
    plain = Encoder()
    y = torch.randn(2, 5, 16)
    assert torch.allclose(encoder(y), plain(y), atol=1e-6)
    assert counters["stats"]["unique_graphs"] >= 1 and all(is_compiled(layer) for layer in encoder.layers)
    assert not compiled_in_place(encoder)  # regional: the blocks, not the whole model


def test_regional_compile_traces_one_graph_for_all_blocks_and_matches_eager():
    """Identical blocks share their compiled code: for 4 blocks dynamo captures one graph and AOTAutograd
    builds one forward / backward pair, a second step recompiles nothing, and the outputs and gradients equal
    the uncompiled model's (aot_eager: AOTAutograd's real forward / backward split, without C++ builds)."""
    from torch._dynamo.utils import counters

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="aot_eager",
                                                                        use_regional_compilation=True))
    model, reference = accelerator.prepare(make_model(layers=4)), make_model(layers=4)
    for _ in range(2):
        out, expected = model(ids), reference(ids)
        out.square().sum().backward()
        expected.square().sum().backward()
    assert counters["stats"]["unique_graphs"] == 1 and counters["aot_autograd"]["total"] == 1, dict(counters)
    assert not counters["recompiles"] and counters["frames"]["total"] == 1, dict(counters)
    assert all(compiled_in_place(layer) for layer in model.layers)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        assert mine.grad is not None, name
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_dynamo_plugin_settings_are_checked_and_backends_given_twice_must_agree():
    with pytest.raises(ValueError) as caught:
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin(backend="inductor",
                                                                                     mode="fastest"))
    message = str(caught.value)
    assert "dynamo_backend='eager' and TorchDynamoPlugin(backend='inductor') disagree" in message
    assert "TorchDynamoPlugin(mode='fastest') is not valid; choose from default" in message
    # only what differs from the defaults, as Accelerate (its suite: test_kwargs_handlers.py::test_torch_dynamo_plugin)
    assert TorchDynamoPlugin(backend="INDUCTOR").to_kwargs() == {"backend": "inductor"}
    assert TorchDynamoPlugin(backend="eager", fullgraph=True).to_kwargs() == {"backend": "eager", "fullgraph": True}
    assert Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="no")).plan.transforms.compile is None


def test_strategies_take_typed_settings_and_refuse_others():
    from overdrive.resolve import DDPSettings
    from overdrive.strategies import create_strategy

    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match="strategy 'fsdp2' takes FSDP2Settings settings, got DDPSettings"):
        create_strategy("fsdp2", accelerator.strategy.context, DDPSettings())
    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_cap'"):
        DDPSettings(bucket_cap=10)  # type: ignore[call-arg]


def test_a_second_accelerator_does_not_change_the_first_ones_plan_and_user_objects_are_copied():
    from overdrive import DataLoaderConfiguration, ProjectConfiguration

    project = ProjectConfiguration(project_dir="/tmp/first")
    loaders = DataLoaderConfiguration(even_batches=True)
    first = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2, project_config=project,
                        dataloader_config=loaders)
    first.project_configuration.iteration += 3
    first.even_batches = False
    assert project.iteration == 0 and loaders.even_batches is True  # the user's objects are left as given
    assert first.plan.project.iteration == 0 and first.plan.dataloader.even_batches is True  # the plan too
    second = Accelerator(cpu=True)
    assert first.state.mixed_precision == "bf16" and first.state.num_steps == 2
    assert second.state.mixed_precision == "no" and AcceleratorState().mixed_precision == "no"  # the newest
    assert first.gradient_state.window is first.window and first.gradient_accumulation_steps == 2


def test_fsdp_plugin_activation_checkpointing_still_works_without_sharding():
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(activation_checkpointing=True))
    model = accelerator.prepare(make_model())
    assert all(is_checkpointed(block) for block in model.layers)
