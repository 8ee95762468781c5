"""``accelerate.utils.tqdm``: the module of the process-aware ``tqdm``.

Importing ``accelerate.utils.tqdm`` makes the import system set ``accelerate.utils.tqdm`` to this module,
where scripts expect the function (Accelerate's package imports the module first, then binds the function);
so this module can be called as the function."""

import sys
from types import ModuleType
from typing import Any

from overdrive.helpers.logging import tqdm


class _CallableModule(ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return tqdm(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
__all__ = ["tqdm"]
