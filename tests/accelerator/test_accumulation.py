"""The accumulation window and the prepared-objects registry: one owner of each piece of training state,
and a checkpoint package that reaches no private attribute of the Accelerator."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from overdrive import Accelerator, GradientAccumulationPlugin
from overdrive.training.accumulation import AccumulationWindow
from overdrive.training.state import GradientState

CHECKPOINT = Path(__file__).resolve().parents[2] / "src" / "overdrive" / "checkpoint"


@pytest.fixture(autouse=True)
def _fresh_gradient_state():
    GradientState._reset_state()
    yield
    GradientState._reset_state()


def test_window_syncs_every_num_steps_and_shortens_the_last_window_of_the_data():
    class Loader:  # what a prepared loader tells the window: its length and the batches handed out
        batches_yielded = 0

        def __len__(self) -> int:
            return 10

    for exact in (False, True):
        loader, window, seen = Loader(), AccumulationWindow(num_steps=4, exact_last_window=exact), []
        for i in range(10):
            loader.batches_yielded = i + 1  # the loader counts a batch before the loop body runs
            seen.append((window.begin(loader, end_of_data=i == 9), window.size, window.divisor))
        assert [s for s, _, _ in seen] == [False, False, False, True] * 2 + [False, True]
        assert [size for _, size, _ in seen] == [4] * 8 + [2, 2]
        # Accelerate divides every loss by num_steps; exact_last_window by the short window's real length
        assert [d for _, _, d in seen] == ([4] * 8 + [2, 2] if exact else [4] * 10)
        assert window.step == 0 and window.position == 0  # Accelerate's count: back to 0 at the end of the data


def test_window_state_round_trips_and_refuses_a_partial_state():
    window = AccumulationWindow(num_steps=3)
    window.begin()
    window.begin()
    state = window.state_dict()
    assert state == {"step": 2, "window_pos": 2, "window_size": 3, "loss_divisor": 3, "num_steps": 3}
    other = AccumulationWindow(num_steps=3)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.sync is False
    assert other.begin() is True  # the third micro-batch of the restored window ends it
    with pytest.raises(KeyError, match="window_pos"):
        other.load_state_dict({"step": 1})
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=0 .* integer >= 1"):
        AccumulationWindow(num_steps=0)


def test_window_reads_the_loader_length_once_per_epoch_and_again_for_a_new_epoch_or_loader():
    class Loader:
        batches_yielded, length, reads = 0, 10, 0

        def __len__(self) -> int:
            self.reads += 1
            return self.length

    loader, window = Loader(), AccumulationWindow(num_steps=4)
    for _epoch in range(2):
        sizes = []
        for i in range(loader.length):
            loader.batches_yielded = i + 1
            window.begin(loader, end_of_data=i == loader.length - 1)
            sizes.append(window.size)
        assert sizes == [4] * 8 + [2, 2]
    assert loader.reads == 2  # once per epoch, not once per window
    loader.length = 5  # a new epoch of another length is read afresh: 4, then a window of 1
    sizes = []
    for i in range(5):
        loader.batches_yielded = i + 1
        window.begin(loader, end_of_data=i == 4)
        sizes.append(window.size)
    assert sizes == [4, 4, 4, 4, 1] and loader.reads == 3
    other = Loader()  # another loader: its own length
    other.length, other.batches_yielded = 2, 1
    window.begin(other)
    assert window.size == 2 and other.reads == 1


@pytest.mark.parametrize("steps_before", [1, 2])
def test_accumulate_with_windows_of_one_syncs_every_batch_and_counts_as_accelerate(steps_before: int):
    """Windows of one micro-batch, through two epochs of a prepared loader (the last batch of each included)
    and after the length changed to 1 in the middle of a window: every batch synchronises, and the step count
    goes back to 0 on a loader's last batch, as Accelerate's does."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=steps_before)
    data = TensorDataset(torch.arange(10.0).unsqueeze(1))
    model, loader = accelerator.prepare(nn.Linear(1, 1), DataLoader(data, batch_size=4))
    with accelerator.accumulate(model):
        pass
    accelerator.gradient_accumulation_steps = 1
    steps = []
    for _epoch in range(2):
        for _batch in loader:
            with accelerator.accumulate(model):
                assert accelerator.sync_gradients
            assert accelerator.window.position == 0
            steps.append(accelerator.step)
    assert steps == [2, 3, 0, 1, 2, 0]


def test_gradient_state_reads_the_accelerators_window():
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3,
                                                                                     sync_each_batch=True))
    state = GradientState()  # built elsewhere (another library): the newest Accelerator's window
    assert state.window is accelerator.window is accelerator.gradient_state.window
    assert (state.num_steps, state.sync_each_batch) == (3, True)
    accelerator.gradient_accumulation_steps = 5
    assert state.num_steps == 5 and accelerator.window.divisor == 5
    accelerator.sync_gradients = False
    assert state.sync_gradients is False
    with pytest.raises(ValueError, match="gradient_accumulation_steps=0"):
        accelerator.gradient_accumulation_steps = 0
    assert accelerator.gradient_accumulation_steps == 5  # a failed change leaves the setting as it was


def test_backward_divides_by_the_window_and_step_counts_micro_batches():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = nn.Linear(2, 1, bias=False)
    nn.init.ones_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    data = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=1)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    grads = []
    for (x,) in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            grads.append(model.weight.grad.clone())
            optimizer.step()
            optimizer.zero_grad()
    # each micro-batch adds its gradient / 2; the window's sum is one batch-of-2 mean
    assert [g.tolist() for g in grads] == [[[0.5, 0.5]], [[1.0, 1.0]]] * 2
    assert accelerator.step == 0  # as Accelerate: the last batch of the loader resets the count
    accelerator.step = 3
    accelerator.free_memory()
    assert accelerator.step == 0 and accelerator.sync_gradients


def test_checkpoint_package_touches_no_private_attribute_of_the_accelerator():
    found = []
    for path in sorted(CHECKPOINT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in ("accelerator", "acc", "run", "holder")):
                found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    assert not found, found
    text = "\n".join(p.read_text() for p in CHECKPOINT.rglob("*.py"))
    assert "accelerator._" not in text


def test_save_state_hands_over_public_stateful_pieces(tmp_path: Path):
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = accelerator.training_state()
    assert state.objects.models == [model] and state.objects.optimizers == [optimizer]
    assert state.window is accelerator.window and state.project is accelerator.project_configuration
    for _ in range(3):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
    accelerator.save_state(tmp_path / "c")
    accelerator.step = 99
    accelerator.load_state(tmp_path / "c")
    assert accelerator.step == 3 and accelerator.window.position == 0
