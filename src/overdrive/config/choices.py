"""One format, everywhere (the command line, config files, the Python API), for a value that is not among
the valid choices: ``<what> is not valid; choose from a, b, c (did you mean 'x'?)``.

The hint follows what the user meant before how the word is spelled: ``fp32`` asks for no mixed precision, so
it is answered ``'no'``, not the nearest spelling ``'fp8'``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

#: the mixed precision names, in the order messages list them (Accelerate's)
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")

#: words users type for a choice -> the choice they mean (used when that choice is offered)
INTENT = {"fp32": "no", "float32": "no", "float": "no", "full": "no", "none": "no", "off": "no", "false": "no",
          "bfloat16": "bf16", "bf": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8"}


def nearest(value: Any, choices: Iterable[Any], cutoff: float = 0.5) -> str:
    """`` (did you mean 'x'?)`` for the choice ``value`` most likely means, or nothing when none is close."""
    lowered = {str(c).lower(): str(c) for c in choices}
    text = str(value).strip().lower()
    meant = INTENT.get(text)
    if meant is not None and meant in lowered:
        return f" (did you mean {lowered[meant]!r}?)"
    match = difflib.get_close_matches(text, list(lowered), n=1, cutoff=cutoff)
    return f" (did you mean {lowered[match[0]]!r}?)" if match else ""


def invalid_choice(what: str, value: Any, choices: Iterable[Any]) -> str:
    """The message for ``value`` (described by ``what``, e.g. ``mixed_precision='fp32'``) outside ``choices``."""
    choices = [str(c) for c in choices]
    return f"{what} is not valid; choose from {', '.join(choices)}{nearest(value, choices)}"


def unexpected_arguments(what: str, function: Callable[..., Any], names: Iterable[str]) -> str:
    """The message for keyword arguments ``names`` that ``function`` (called as ``what``) does not take, each
    with the parameter it most likely means: ``Accelerator() got unexpected arguments ['mixed_precison']
    (did you mean 'mixed_precision'?)``."""
    accepted = [name for name, parameter in inspect.signature(function).parameters.items()
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and name != "self"]
    names = sorted(names)
    hints = {name: nearest(name, accepted, 0.75) for name in names}
    if len(names) == 1 or not any(hints.values()):
        return f"{what} got unexpected arguments {names}{hints[names[0]] if len(names) == 1 else ''}"
    return f"{what} got unexpected arguments {names}: {', '.join(f'{name!r}{hints[name]}' for name in names)}"
