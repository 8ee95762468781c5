"""Big-model dispatch on every GPU of this machine: a model split over the GPUs, the CPU and the disk gives
the outputs of the model on one device (called by scripts/gpu_check.py whenever a GPU exists).

    python scripts/gpu_check_big_model.py           # the GPUs torch sees (skipped when there is none)
    python scripts/gpu_check_big_model.py --cpu     # the same logic with CPU in place of the GPUs

Checks, each printed as one table row:

- ``infer_auto_device_map`` with the real free memory capped per GPU plans a map over every GPU (and the
  CPU / disk), never splits a Block, keeps the tied head with the embedding;
- ``load_checkpoint_and_dispatch`` of that plan: each block's weights live on its GPU, offloaded blocks on
  the meta device, and the logits equal the one-device model's (fp32, tolerance 1e-4);
- ``dispatch_model`` with an explicit map using every GPU, "cpu" and "disk": same logits;
- ``cpu_offload`` to GPU 0 and ``cpu_offload_with_hook`` chains: same outputs, each model back on the CPU
  after the next one starts.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from typing import Any

WIDTH, VOCAB, BLOCKS = 256, 512, 8


def build(seed: int = 0) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(WIDTH)
            self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(torch.relu(self.fc1(self.norm(x))))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.embed(ids)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    torch.manual_seed(seed)
    return Model().eval()


def _devices(cpu: bool) -> list[Any]:
    import torch

    return ["cpu"] if cpu else list(range(torch.cuda.device_count()))


def _close(got: Any, expected: Any) -> float:
    return float((got.float().cpu() - expected.float().cpu()).abs().max())


def check_auto_map(folder: str, devices: list[Any], ids: Any, expected: Any) -> str:
    from overdrive.big_model import (
        compute_module_sizes,
        infer_auto_device_map,
        init_empty_weights,
        load_checkpoint_and_dispatch,
    )

    with init_empty_weights():
        model = build()
    block = compute_module_sizes(model)["blocks.0"]
    if devices == ["cpu"]:
        memory: dict[Any, Any] = {"cpu": 3 * block}
    else:  # about 2 blocks per GPU, the rest on the CPU and disk
        memory = {d: 3 * block for d in devices} | {"cpu": 3 * block}
    device_map = infer_auto_device_map(model, memory, no_split_module_classes=["Block"])
    assert not any(k.count(".") > 1 for k in device_map), f"a Block was split: {device_map}"
    assert device_map.get("head", device_map.get("")) == device_map.get("embed", device_map.get("")), device_map
    used = set(device_map.values())
    assert all(d in used for d in devices), f"not every device is used: {device_map}"
    model = load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=f"{folder}/auto")
    for name, device in device_map.items():
        if name.startswith("blocks.") and device not in ("cpu", "disk") and devices != ["cpu"]:
            weight = model.get_submodule(name).fc1.weight
            assert weight.device.index == device, f"{name} is on {weight.device}, planned {device}"
        if device == "disk":
            assert model.get_submodule(name).fc1.weight.device.type == "meta", f"{name} should be offloaded"
    diff = _close(model(ids), expected)
    assert diff < 1e-4, f"logits differ by {diff}"
    return f"{sorted(map(str, used))}, max diff {diff:.1e}"


def check_explicit_map(devices: list[Any], ids: Any, expected: Any) -> str:
    from overdrive.big_model import dispatch_model

    model = build()
    device_map: dict[str, Any] = {"embed": devices[0], "head": devices[0]}
    for index in range(BLOCKS - 2):
        device_map[f"blocks.{index}"] = devices[index % len(devices)]
    device_map[f"blocks.{BLOCKS - 2}"] = "cpu"
    device_map[f"blocks.{BLOCKS - 1}"] = "disk"
    with tempfile.TemporaryDirectory() as folder:
        dispatch_model(model, device_map, offload_dir=folder)
        diff = _close(model(ids), expected)
    assert diff < 1e-4, f"logits differ by {diff}"
    return f"{len(devices)} device(s) + cpu + disk, max diff {diff:.1e}"


def check_offload(devices: list[Any], ids: Any, expected: Any) -> str:
    import torch

    from overdrive.big_model import cpu_offload, cpu_offload_with_hook, remove_hook_from_module

    target = torch.device("cpu") if devices == ["cpu"] else torch.device("cuda", 0)
    model = cpu_offload(build(), execution_device=target)
    diff = _close(model(ids.to(target)), expected)
    assert diff < 1e-4, f"cpu_offload logits differ by {diff}"
    remove_hook_from_module(model, recurse=True)
    first, second = build(), torch.nn.Linear(VOCAB, 8)
    want = second(expected)
    first, hook1 = cpu_offload_with_hook(first, target)
    second, hook2 = cpu_offload_with_hook(second, target, prev_module_hook=hook1)
    out = first(ids)
    assert first.embed.weight.device == target, "the first model did not move to the execution device"
    out = second(out)
    assert first.embed.weight.device.type == "cpu", "the first model was not sent back when the second started"
    hook2.offload()
    assert second.weight.device.type == "cpu"
    chain_diff = _close(out, want)
    assert chain_diff < 1e-4, f"chain output differs by {chain_diff}"
    return f"cpu_offload diff {diff:.1e}, chain diff {chain_diff:.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="check the logic on the CPU")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("big-model dispatch check skipped: no CUDA device")
        return 0
    devices = _devices(args.cpu)
    reference = build()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids)
    failed = False
    rows = []
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        from safetensors.torch import save_model

        save_model(reference, f"{folder}/model.safetensors")
        for name, check in (("infer_auto_device_map + load_checkpoint_and_dispatch",
                             lambda: check_auto_map(folder, devices, ids, expected)),
                            ("dispatch_model, explicit map", lambda: check_explicit_map(devices, ids, expected)),
                            ("cpu_offload / cpu_offload_with_hook", lambda: check_offload(devices, ids, expected))):
            try:
                rows.append(f"| {name} | ok | {check()} |")
            except Exception:  # noqa: BLE001 - report every check
                failed = True
                rows.append(f"| {name} | FAILED | {traceback.format_exc().strip().splitlines()[-1]} |")
    kind = "CPU" if args.cpu else f"{len(devices)} x {torch.cuda.get_device_name(0)}"
    print(f"\nbig-model dispatch on {kind}\n| check | result | detail |\n|---|---|---|\n" + "\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
