"""The one registry of the hooks overdrive puts on prepared models (autocast around forward, the cast of a
DeepSpeed engine's inputs and outputs), so that ``unwrap_model(keep_fp32_wrapper=False)`` and
``free_memory()`` remove them whatever strategy attached them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def remove_hooks(handles: Iterable[Any]) -> None:
    """Remove each of ``handles`` (e.g. those a failed ``wrap_model`` had added)."""
    for handle in handles:
        handle.remove()


class HookRegistry:
    """Removable hook handles, filed under the prepared model they belong to. The strategy's ``wrap_model``
    appends the handles of the hooks it adds to a list the Accelerator gives it; the Accelerator files them
    with the prepared model::

        handles = []
        prepared = strategy.wrap_model(model, hooks=handles)
        registry.add(handles, prepared, strategy.unwrap_model(prepared))
        registry.remove(prepared)       # unwrap_model(prepared, keep_fp32_wrapper=False)
    """

    def __init__(self) -> None:
        self._by_model: dict[int, list[Any]] = {}

    def add(self, handles: list[Any], *models: object) -> None:
        """File ``handles`` (each with ``remove()``) under each of ``models`` (the same handles under every one)."""
        if handles:
            for model in models:
                self._by_model.setdefault(id(model), []).extend(handles)

    def remove(self, *models: object) -> int:
        """Remove the hooks filed under any of ``models``; return how many handles were removed."""
        handles: dict[int, Any] = {}
        for model in models:
            for handle in self._by_model.pop(id(model), []):
                handles[id(handle)] = handle
        for key in [k for k, hs in self._by_model.items() if any(id(h) in handles for h in hs)]:
            del self._by_model[key]  # the same handles filed under another name of the model
        remove_hooks(handles.values())
        return len(handles)

    def clear(self) -> None:
        """Remove every hook (``free_memory``)."""
        remove_hooks({id(h): h for hs in self._by_model.values() for h in hs}.values())
        self._by_model.clear()

    def __len__(self) -> int:
        return len({id(h) for hs in self._by_model.values() for h in hs})
