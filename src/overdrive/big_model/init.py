"""Build models without spending memory on their weights: ``init_empty_weights`` and ``init_on_device``.

    with init_empty_weights():
        model = MyModel(config)          # parameters on the meta device: shapes and dtypes, no storage

The weights are filled in later by :func:`overdrive.big_model.loading.load_checkpoint_and_dispatch`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["init_empty_weights", "init_on_device"]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Create every parameter registered inside the block on the meta device (no memory, no init cost).

    Buffers stay real (on the CPU) unless ``include_buffers=True``, because constructors often compute them
    (rotary frequencies, position ids) and nothing would fill them in again from a checkpoint.
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device | str | int, include_buffers: bool | None = None) -> Iterator[None]:
    """Put every parameter (and with ``include_buffers=True`` every tensor) created inside the block on
    ``device``.

    With buffers included the whole block runs under ``torch.device(device)``, so tensors are created there
    directly. Without them only ``nn.Module.register_parameter`` is redirected: a parameter is created
    where its constructor asks, then moved, so the cost is one parameter at a time.
    """
    device = torch.device(device)
    if include_buffers:
        with device:
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is None:
            return
        registered = module._parameters[name]
        assert registered is not None
        if registered.device == device:
            return  # already there (a tied parameter assigned again): keep the very same object
        # keep the parameter's own class and attributes (quantized and custom Parameter subclasses)
        extra = dict(registered.__dict__)
        moved = type(registered)(registered.to(device), requires_grad=registered.requires_grad)
        for key, value in extra.items():
            setattr(moved, key, value)
        module._parameters[name] = moved

    # patched on purpose for the duration of the block (as Accelerate's init_on_device does)
    nn.Module.register_parameter = register_on_device  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        nn.Module.register_parameter = original
