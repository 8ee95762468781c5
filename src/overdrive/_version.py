"""The package version (its own module so that any layer can read it without importing the package's
public surface)."""

__version__ = "0.1.0"

#: The Accelerate release whose API overdrive follows, the one place it is written: `accelerate.__version__` and
#: importlib.metadata answer it under the alias (compat/table.py's ACCELERATE_VERSION is this one).
ACCELERATE_API_VERSION = "1.16.0"
