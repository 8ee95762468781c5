"""Accelerate names overdrive does not implement: importable, and refusing clearly when used.

A library may import such a name at module level (to build a type check or a default), so importing
must work; calling it (or building the class) raises ``NotImplementedError`` naming what is not
supported and what to use instead. Never a silent placeholder.
"""

from __future__ import annotations

from typing import Any, NoReturn


class UnsupportedFeatureError(NotImplementedError):
    """An Accelerate feature overdrive does not implement was used."""


def _refuse(name: str, why: str, instead: str) -> NoReturn:
    raise UnsupportedFeatureError(f"{name} is not supported by overdrive: {why}; {instead}")


def refusing_function(name: str, why: str, instead: str) -> Any:
    """A function called ``name`` that raises ``UnsupportedFeatureError`` when called."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(name, why, instead)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported by overdrive ({why}); {instead}."
    refuse.__module__ = __name__
    return refuse


def refusing_class(name: str, why: str, instead: str) -> type:
    """A class called ``name`` (so ``isinstance`` checks answer False) whose construction raises."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _refuse(name, why, instead)

    return type(name, (), {"__init__": __init__, "__module__": __name__,
                           "__doc__": f"Not supported by overdrive ({why}); {instead}."})
