"""Issue 21's surface bullets, each compared with the real Accelerate on 2 gloo processes running the same
code: the save / load pre-hooks receive the user's models (diffusers calls ``model.save_pretrained`` in
them), ``get_state_dict`` is full on every rank under DDP, ``print(accelerator.state)`` has Accelerate's
lines, ``PartialState._shared_state`` / ``AcceleratorState._shared_state`` say whether a state exists, and
``Accelerator.init_handler`` is the ``InitProcessGroupKwargs`` given."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.distributed import run_distributed

pytestmark = [pytest.mark.requires("accelerate")]


def _surface(engine: str, folder: str) -> dict:
    """The same Accelerate script under ``engine`` ("accelerate": the real one, "overdrive": the alias)."""
    if engine == "overdrive":
        import overdrive

        overdrive.install_as_accelerate()
    import datetime

    import torch
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import InitProcessGroupKwargs

    class Unet(torch.nn.Module):  # the shape of a diffusers model: save_pretrained / from_pretrained
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

        def save_pretrained(self, path: str) -> None:
            os.makedirs(path, exist_ok=True)
            torch.save(self.state_dict(), os.path.join(path, "weights.pt"))

        @classmethod
        def from_pretrained(cls, path: str) -> Unet:
            model = cls()
            model.load_state_dict(torch.load(os.path.join(path, "weights.pt")))
            return model

    out: dict = {"partial_before": PartialState._shared_state == {},
                 "accelerator_before": AcceleratorState._shared_state == {}}
    handler = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=77))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    out["init_handler"] = (type(accelerator.init_handler).__name__, accelerator.init_handler.timeout.total_seconds())
    out["partial_after"] = PartialState._shared_state != {}
    out["accelerator_after"] = AcceleratorState._shared_state != {}
    out["gradient_after"] = GradientState._shared_state != {}
    out["repr"] = repr(accelerator.state)
    torch.manual_seed(0)
    unet = Unet()
    optimizer = torch.optim.SGD(unet.parameters(), lr=0.1)
    unet, optimizer = accelerator.prepare(unet, optimizer)
    state = accelerator.get_state_dict(unet)
    out["state_dict"] = {k: v.tolist() for k, v in state.items()}
    out["state_dict_devices"] = sorted({str(v.device) for v in state.values()})
    seen: dict = {}

    def save_hook(models: list, weights: list, output_dir: str) -> None:  # diffusers' train_unconditional.py
        seen["save"] = [type(m).__name__ for m in models]
        if accelerator.is_main_process:
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_hook(models: list, input_dir: str) -> None:
        seen["load"] = [type(m).__name__ for m in models]
        for _ in range(len(models)):
            model = models.pop()
            loaded = Unet.from_pretrained(os.path.join(input_dir, "unet"))
            model.load_state_dict(loaded.state_dict())

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    accelerator.save_state(os.path.join(folder, engine))
    accelerator.wait_for_everyone()  # the main process wrote unet/ in its hook
    expected = [p.detach().clone() for p in unet.parameters()]
    with torch.no_grad():
        for p in unet.parameters():
            p.zero_()
    accelerator.load_state(os.path.join(folder, engine))
    out["restored"] = all(torch.equal(a, b) for a, b in zip(expected, unet.parameters()))
    out["hooks"] = seen
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    folder = str(tmp_path_factory.mktemp("fidelity"))
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"), *sys.path])}
    return {engine: run_distributed(_surface, 2, engine, folder, env=env, timeout=180)
            for engine in ("accelerate", "overdrive")}


def test_hooks_receive_the_users_models(both: dict[str, list[dict]]) -> None:
    real, ours = both["accelerate"], both["overdrive"]
    assert [r["hooks"] for r in ours] == [r["hooks"] for r in real]
    assert ours[0]["hooks"]["save"] == ["Unet"]  # not DistributedDataParallel: save_pretrained works
    assert all(r["restored"] for r in real + ours)


def test_get_state_dict_is_full_on_every_rank(both: dict[str, list[dict]]) -> None:
    real, ours = both["accelerate"], both["overdrive"]
    assert [r["state_dict"] for r in ours] == [r["state_dict"] for r in real]
    assert ours[1]["state_dict"] and ours[1]["state_dict"] == ours[0]["state_dict"]
    assert [r["state_dict_devices"] for r in ours] == [r["state_dict_devices"] for r in real]


def test_state_repr_and_shared_state(both: dict[str, list[dict]]) -> None:
    real, ours = both["accelerate"], both["overdrive"]
    # Accelerate numbers the CPU of every process cpu:0; overdrive's device is plain cpu (the one difference)
    assert [r["repr"] for r in ours] == [r["repr"].replace("Device: cpu:0", "Device: cpu") for r in real]
    assert "Mixed precision type: no" in ours[0]["repr"]
    for key in ("partial_before", "accelerator_before", "partial_after", "accelerator_after", "gradient_after"):
        assert [r[key] for r in ours] == [r[key] for r in real], key
    assert ours[0]["partial_before"] and ours[0]["partial_after"]


def test_init_handler_is_the_one_given(both: dict[str, list[dict]]) -> None:
    assert [r["init_handler"] for r in both["overdrive"]] == [r["init_handler"] for r in both["accelerate"]]
    assert both["overdrive"][0]["init_handler"] == ("InitProcessGroupKwargs", 77.0)
