"""The package version (its own module so that any layer can read it without importing the package's
public surface)."""

__version__ = "0.1.0"

#: The Accelerate release whose API overdrive follows (compat/table.py's ACCELERATE_VERSION is this one).
ACCELERATE_API_VERSION = "1.15.0"
