"""The one registry of the hooks overdrive puts on prepared models (autocast around forward, the cast of a
DeepSpeed engine's inputs and outputs), so that ``unwrap_model(keep_fp32_wrapper=False)`` and
``free_memory()`` remove them whatever strategy attached them."""

from __future__ import annotations

from typing import Any


class HookRegistry:
    """Removable hook handles, filed under the prepared model they belong to.

    A strategy adds handles while it wraps a model (they wait as *pending*); the Accelerator then files
    them under the prepared model and the user's module inside it (:meth:`claim`)::

        registry.add(precision.attach(model))
        prepared = strategy.wrap_model(model)
        registry.claim(prepared, strategy.unwrap_model(prepared))
        registry.remove(prepared)       # unwrap_model(prepared, keep_fp32_wrapper=False)
    """

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self._by_model: dict[int, list[Any]] = {}

    def add(self, handles: list[Any]) -> None:
        """Record ``handles`` (each with ``remove()``) for the model being prepared."""
        self._pending.extend(handles)

    def claim(self, *models: object) -> None:
        """File the pending handles under each of ``models`` (the same handles under every one)."""
        handles, self._pending = self._pending, []
        if handles:
            for model in models:
                self._by_model.setdefault(id(model), []).extend(handles)

    def discard_pending(self) -> None:
        """Remove the hooks added for a model whose preparation failed."""
        for handle in self._pending:
            handle.remove()
        self._pending.clear()

    def remove(self, *models: object) -> int:
        """Remove the hooks filed under any of ``models``; return how many handles were removed."""
        handles: dict[int, Any] = {}
        for model in models:
            for handle in self._by_model.pop(id(model), []):
                handles[id(handle)] = handle
        for key in [k for k, hs in self._by_model.items() if any(id(h) in handles for h in hs)]:
            del self._by_model[key]  # the same handles filed under another name of the model
        for handle in handles.values():
            handle.remove()
        return len(handles)

    def clear(self) -> None:
        """Remove every hook (``free_memory``)."""
        for handle in {id(h): h for hs in self._by_model.values() for h in hs}.values():
            handle.remove()
        for handle in self._pending:
            handle.remove()
        self._by_model.clear()
        self._pending.clear()

    def __len__(self) -> int:
        return len({id(h) for hs in self._by_model.values() for h in hs}) + len(self._pending)
