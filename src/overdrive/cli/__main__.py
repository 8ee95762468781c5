"""``python -m overdrive.cli ...`` is ``overdrive ...``."""

import sys

from overdrive.cli import main

if __name__ == "__main__":
    sys.exit(main())
