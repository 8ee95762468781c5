"""``FrozenValue``: the base of the resolver's frozen value types (the plan and its parts).

A frozen dataclass builds its methods by compiling generated source when its module is imported: 2.5-10 M
instructions a class here (a 23-field one costs 10.7 M), paid at every start-up, where a class written
out is compiled once into the bytecode cache. These classes are built on every start, so they are written out:
the fields are the class's annotations, ``__init__`` is ordinary code, and this base gives what the dataclass
gave: assignment refused (``dataclasses.FrozenInstanceError``), equality, hash and repr over the fields in order.
Copies (``copy.copy``, ``copy.deepcopy``, pickling) work as for a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, ClassVar


class FrozenValue:
    """An immutable value whose fields are its class annotations; ``__init__`` ends with
    ``self._init(locals())`` after settling its defaults."""

    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = tuple(name for name, kind in cls.__dict__.get("__annotations__", {}).items()
                    if not str(kind).startswith("ClassVar"))
        cls._fields = cls._fields + tuple(name for name in own if name not in cls._fields)

    def _init(self, values: dict[str, Any]) -> None:
        for name in self._fields:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # pyright: ignore[reportAttributeAccessIssue]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"
