"""The package version (its own module so that any layer can read it without importing the package's
public surface)."""

__version__ = "0.1.0"
