"""The names users import from ``accelerate.utils``, under ``overdrive.utils``.

Every name comes from the one compat table (``overdrive.compat.table.NAMES["overdrive.utils"]``) and is
imported on first use, so that ``from overdrive.utils import set_seed`` loads only what it needs.
"""

from __future__ import annotations

from overdrive._lazy import lazy_exports


def _table() -> dict[str, str]:
    from overdrive.compat.table import NAMES

    return NAMES["overdrive.utils"]


__getattr__, __dir__ = lazy_exports(__name__, _table)
