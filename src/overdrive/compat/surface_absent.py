"""Accelerate public names overdrive does not serve under the alias, each with its reason."""

from __future__ import annotations

#: ``accelerate.<module>.<name>`` -> why overdrive does not serve it
ABSENT_NAMES: dict[str, str] = {}
