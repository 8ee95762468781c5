"""``accelerate.memory_utils``: Accelerate's old module path, which only warns that it moved."""

import warnings

warnings.warn("memory_utils has been reorganized to utils.memory. Import `find_executable_batchsize` from the main "
              "`__init__`: `from accelerate import find_executable_batch_size` to avoid this warning.",
              FutureWarning, stacklevel=2)
