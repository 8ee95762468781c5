"""``accelerate.commands.test`` under overdrive: names re-exported from overdrive's own modules.

Generated from overdrive.compat.table by scripts/accelerate_compat_modules.py; edit the table, not this file.
"""

from overdrive.compat.reexport import exports

__getattr__, __dir__, __all__ = exports(__name__)
