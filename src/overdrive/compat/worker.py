"""The worker entry point of ``overdrive launch --as_accelerate``: alias ``accelerate`` to overdrive, then run
the target exactly as ``overdrive.launchers.worker`` does."""

from __future__ import annotations

from overdrive.compat.alias import install_as_accelerate
from overdrive.launchers.worker import main as run_worker


def main() -> None:
    """Install the alias, then run the target as ``overdrive.launchers.worker`` does."""
    install_as_accelerate()

    run_worker()


if __name__ == "__main__":
    main()
