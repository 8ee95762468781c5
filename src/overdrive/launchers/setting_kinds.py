"""The value kinds of the launch settings: the one set of validators behind the flags, the config file, the
``ACCELERATE_*`` variables and the ``overdrive config`` questions.

Every kind is called as ``kind.check(label, value) -> (value, problem)``: the value normalised (``"BF16"`` ->
``"bf16"``, ``"4"`` -> ``4``) and ``None``, or the value as given and a message. The message is
``"<label>: <what is wrong>"`` whichever way the value came in, so ``--num_processes 0``,
``num_processes: 0`` in a file and ``ACCELERATE_NUM_PROCESSES=0`` differ only in the label::

    Int(minimum=1).check("--num_processes", "0")   # -> ("0", "--num_processes: 0 must be 1 or more")

Nothing here imports torch (the launcher refuses a bad value before it loads torch), except ``Device``,
which asks torch what a device is, and only when a value is checked.
"""

from __future__ import annotations

from collections.abc import Mapping as MappingABC
from typing import Any

from overdrive.config.choices import invalid_choice

#: Accelerate's ``str_to_bool`` words (flags, files and variables all take them)
TRUE_WORDS = ("1", "true", "yes", "y", "on", "t")
FALSE_WORDS = ("0", "false", "no", "n", "off", "f")

Checked = tuple[Any, "str | None"]


class Kind:
    """A kind of value; subclasses implement ``check`` and say what they take in ``describe``. (Plain classes,
    not dataclasses: this module is imported on every ``overdrive launch``, before its arguments are checked.)"""

    #: what a flag of this kind shows in ``--help`` (``N``, ``VALUE``...)
    metavar = "VALUE"

    def __init__(self, *, metavar: str | None = None) -> None:
        if metavar is not None:
            self.metavar = metavar

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def check(self, label: str, value: Any) -> Checked:
        """``(normalised value, None)``, or ``(value, message)`` when ``value`` is not of this kind."""
        return value, None

    def describe(self) -> str:
        """What the kind takes, for the docs table."""
        return "text"

    def shown_metavar(self) -> str:
        """The metavar of a flag of this kind."""
        return self.metavar


class Bool(Kind):
    """true / false (also yes / no, 1 / 0, on / off, as Accelerate's ``str_to_bool``)."""

    metavar = "BOOL"

    def check(self, label: str, value: Any) -> Checked:
        if isinstance(value, bool):
            return value, None
        text = str(value).strip().lower()
        if text in TRUE_WORDS or text in FALSE_WORDS:
            return text in TRUE_WORDS, None
        return value, f"{label}: {value!r} is not a boolean; use true or false"

    def describe(self) -> str:
        return "true / false"


class Int(Kind):
    """An integer, at least ``minimum`` (when given), or one of ``allow`` (kept as given: ``-1``, ``None``);
    with ``choices``, one of those."""

    metavar = "N"

    def __init__(self, *, minimum: int | None = None, maximum: int | None = None, allow: tuple[Any, ...] = (),
                 choices: tuple[int, ...] = (), metavar: str | None = None) -> None:
        super().__init__(metavar=metavar)
        self.minimum, self.maximum, self.allow, self.choices = minimum, maximum, allow, choices

    def check(self, label: str, value: Any) -> Checked:
        if value in self.allow and not isinstance(value, bool):
            return value, None
        try:
            number = None if isinstance(value, (bool, float)) else int(str(value).strip())
        except ValueError:
            number = None
        if number is None or (isinstance(value, float) and not value.is_integer()):
            return value, f"{label}: {value!r} is not an integer"
        if number in self.allow:
            return number, None
        if self.choices and number not in self.choices:
            return value, invalid_choice(f"{label}: {number}", number, self.choices)
        if self.minimum is not None and number < self.minimum:
            return value, f"{label}: {number} must be {self.minimum} or more"
        if self.maximum is not None and number > self.maximum:
            return value, f"{label}: {number} must be {self.maximum} or less"
        return number, None

    def describe(self) -> str:
        if self.choices:
            return " / ".join(map(str, self.choices))
        parts = ["integer"]
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"{self.minimum}-{self.maximum}")
        elif self.minimum is not None:
            parts.append(f">= {self.minimum}")
        allowed = [repr(a) if a is not None else "empty" for a in self.allow]
        return " ".join(parts) + (f" (or {', '.join(allowed)})" if allowed else "")


class Float(Kind):
    """A number; above ``above`` when given; or one of ``allow`` (kept as given: ``"auto"``)."""

    metavar = "NUMBER"

    def __init__(self, *, above: float | None = None, allow: tuple[Any, ...] = (), metavar: str | None = None) -> None:
        super().__init__(metavar=metavar)
        self.above, self.allow = above, allow

    def check(self, label: str, value: Any) -> Checked:
        if value in self.allow:
            return value, None
        try:
            number = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            return value, f"{label}: {value!r} is not a number"
        if self.above is not None and not number > self.above:
            return value, f"{label}: {number:g} must be above {self.above:g}"
        return number, None

    def describe(self) -> str:
        text = "number" + (f" > {self.above:g}" if self.above is not None else "")
        return text + (f" (or {', '.join(map(repr, self.allow))})" if self.allow else "")


class Choice(Kind):
    """One of ``choices``, in any case; normalised to the case of the choices (``case``: "lower", "upper" or
    "exact", which compares as written)."""

    def __init__(self, choices: tuple[str, ...], *, case: str = "lower", metavar: str | None = None) -> None:
        super().__init__(metavar=metavar)
        self.choices, self.case = choices, case

    def _norm(self, text: str) -> str:
        return text.lower() if self.case == "lower" else text.upper() if self.case == "upper" else text

    def check(self, label: str, value: Any) -> Checked:
        text = self._norm(str(value).strip())
        for choice in self.choices:
            if self._norm(choice) == text:
                return choice, None
        return value, invalid_choice(f"{label}: {value!r}", value, self.choices)

    def describe(self) -> str:
        return " / ".join(f"`{c}`" for c in self.choices)

    def shown_metavar(self) -> str:
        return "{" + ",".join(self.choices) + "}" if self.metavar == "VALUE" and len(self.choices) <= 6 else self.metavar


class Text(Kind):
    """A string (a number given in a file is read as its text)."""

    def check(self, label: str, value: Any) -> Checked:
        if value is None or isinstance(value, str):
            return value, None
        if isinstance(value, (int, float)):
            return str(value), None
        return value, f"{label}: {value!r} should be a string"

    def describe(self) -> str:
        return "text"


class LighthouseAddress(Kind):
    """A torchft lighthouse's address, ``http://HOST:PORT`` (``HOST:PORT`` is read as that); an IPv6 host
    in brackets."""

    metavar = "URL"

    def check(self, label: str, value: Any) -> Checked:
        if value is None:
            return None, None
        text = str(value).strip()
        address = text if "://" in text else f"http://{text}"
        scheme, _, rest = address.partition("://")
        host, _, port = rest.rstrip("/").rpartition(":")
        if scheme in ("http", "https") and host.strip("[]") and "/" not in host and port.isdigit() \
                and 0 < int(port) < 65536:
            return f"{scheme}://{host}:{port}", None
        return value, (f"{label}: {value!r} is not a lighthouse address; give http://HOST:PORT, the address "
                       "'overdrive lighthouse' prints (e.g. http://10.0.0.1:29510)")

    def describe(self) -> str:
        return "`http://HOST:PORT`"


class GpuIds(Kind):
    """``all`` or a comma-separated list of device ids."""

    metavar = "IDS"

    def check(self, label: str, value: Any) -> Checked:
        text = str(value).strip().replace(" ", "")
        if text.lower() == "all":
            return "all", None
        if text and all(part.isdigit() for part in text.split(",")):
            return text, None
        return value, f"{label}: {value!r} is not valid; give 'all' or a comma-separated list of device ids like '0,1'"

    def describe(self) -> str:
        return "`all` or ids like `0,1`"


class Mapping(Kind):
    """A mapping of keys to values (empty when not given)."""

    def check(self, label: str, value: Any) -> Checked:
        if value is None:
            return {}, None
        if isinstance(value, MappingABC):
            return dict(value), None
        return value, f"{label}: {value!r} should be a mapping of keys to values"

    def describe(self) -> str:
        return "mapping"


class List(Kind):
    """A list (or nothing)."""

    def check(self, label: str, value: Any) -> Checked:
        if value is None or isinstance(value, list):
            return value, None
        return value, f"{label}: {value!r} should be a list"

    def describe(self) -> str:
        return "list"


class Device(Kind):
    """A torch device name (``cpu``, ``cuda:1``...)."""

    metavar = "DEVICE"

    def check(self, label: str, value: Any) -> Checked:
        import torch  # lazy: the schema is read before torch loads (argument checks)

        try:
            return str(torch.device(str(value).strip())), None
        except (RuntimeError, ValueError):
            return value, f"{label}: {value!r} is not a torch device; use e.g. cpu, cuda, cuda:1, xpu:0"

    def describe(self) -> str:
        return "torch device"


class Bools(Kind):
    """``count`` booleans, comma-separated (``False,False,True``, also in brackets) or a list."""

    def __init__(self, *, count: int = 3, names: str = "fprop, dgrad, wgrad") -> None:
        super().__init__()
        self.count, self.names = count, names

    def check(self, label: str, value: Any) -> Checked:
        parts = value if isinstance(value, (list, tuple)) else \
            [p.strip() for p in str(value).strip("()[] ").split(",") if p.strip()]
        checked = [Bool().check(label, p) for p in parts]
        if len(parts) != self.count or any(problem for _, problem in checked):
            example = ",".join(["False"] * (self.count - 1) + ["True"])
            return value, f"{label}: {value!r} is not {self.count} booleans ({self.names}), e.g. {example}"
        return [v for v, _ in checked], None

    def describe(self) -> str:
        return f"{self.count} booleans ({self.names})"
