"""``DataLoaderConfiguration(use_stateful_dataloader=True)`` builds the prepared loaders on torchdata's
``StatefulDataLoader``, as Accelerate does: ``state_dict()`` is torchdata's, and a state taken mid-epoch, loaded
into a fresh loader, gives exactly the remaining batches (map-style shuffled with a seeded generator, iterable,
dispatched), and so does ``save_state`` / ``load_state``; 1 and 2 processes. (Accelerate's own tests of these
loaders, tests/test_data_loader.py of its sdist, run in scripts/accelerate_suite.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.support.distributed import run_distributed

pytestmark = pytest.mark.requires("torchdata")  # StatefulDataLoader


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(100, 124))  # whole steps: padding a short last step comes from the first samples read


def _loaders(accelerator) -> dict:
    # in order: torchdata fast-forwards a torch sampler by re-reading it, which replays a shuffled epoch only
    # when its generator is where it was (tests/compat/test_resume_fidelity.py compares that case with Accelerate)
    return {"mapped": accelerator.prepare(DataLoader(list(range(37)), batch_size=3)),
            "stream": accelerator.prepare(DataLoader(Stream(), batch_size=2))}


def _accelerator(dispatch: bool | None = None):
    from overdrive import Accelerator, DataLoaderConfiguration
    from overdrive.training.state import GradientState

    GradientState._reset_state()
    config = DataLoaderConfiguration(use_stateful_dataloader=True, dispatch_batches=dispatch)
    return Accelerator(cpu=True, dataloader_config=config)


def _resume_checks(folder: str) -> dict:
    """Per loader: (the remaining batches, those after load_state_dict, those after load_state)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    out: dict = {}
    for dispatch in (None, False):  # the default (iterable data dispatched) and every loader sharded
        accelerator = _accelerator(dispatch)
        loaders = _loaders(accelerator)
        assert all(isinstance(loader, StatefulDataLoader) for loader in loaders.values())
        iterators, states = {}, {}
        for name, loader in loaders.items():
            iterators[name] = iter(loader)
            for _ in range(2):
                next(iterators[name])
            states[name] = loader.state_dict()
        saved = accelerator.save_state(str(Path(folder) / f"ckpt_{dispatch}"))
        remaining = {name: [b.tolist() for b in it] for name, it in iterators.items()}

        fresh = _loaders(_accelerator(dispatch))
        for name, loader in fresh.items():
            loader.load_state_dict(states[name])
        from_state = {name: [b.tolist() for b in loader] for name, loader in fresh.items()}

        accelerator = _accelerator(dispatch)
        restored = _loaders(accelerator)
        accelerator.load_state(saved)
        from_checkpoint = {name: [b.tolist() for b in loader] for name, loader in restored.items()}
        out[str(dispatch)] = (remaining, from_state, from_checkpoint)
    return out


def _check(results: list) -> None:
    for per_rank in results:
        for remaining, from_state, from_checkpoint in per_rank.values():
            assert all(remaining[name] for name in remaining)  # something was left to resume
            assert from_state == remaining and from_checkpoint == remaining


def test_state_dict_is_torchdatas_and_exact_resume_excludes_it():
    from torchdata.stateful_dataloader import StatefulDataLoader

    from overdrive import Accelerator, DataLoaderConfiguration
    from overdrive.data import DataLoaderShard, prepare_data_loader

    reference = StatefulDataLoader(list(range(40)), batch_size=4)
    ours = DataLoaderShard(list(range(40)), batch_size=4, use_stateful_dataloader=True)
    assert isinstance(ours, StatefulDataLoader) and ours.use_stateful_dataloader
    for (index, a), b in zip(enumerate(reference), ours):  # ours reads one batch ahead; its state does not
        assert torch.equal(a, b)
        if index == 3:
            break
    assert ours.state_dict() == reference.state_dict()
    with pytest.raises(ValueError, match="choose one way to resume"):
        prepare_data_loader(DataLoader(range(8), batch_size=2), use_stateful_dataloader=True, exact_resume=True)
    with pytest.raises(ValueError, match="choose one way to resume"):
        Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, exact_resume=True))


def test_stateful_loader_resumes_exactly_on_one_process(tmp_path):
    _check([_resume_checks(str(tmp_path))])


@pytest.mark.timeout(240)
def test_stateful_loader_resumes_exactly_on_two_processes(tmp_path):
    results = run_distributed(_resume_checks, 2, str(tmp_path), timeout=220)
    _check(results)
    # the ranks had different shares of the data
    assert results[0]["False"][0] != results[1]["False"][0]
