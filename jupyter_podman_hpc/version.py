"""The package's version, in a module of its own (pyproject.toml reads it from here): the
engine and the fronts read it without importing the package's Jupyter entry points."""

__version__ = "0.1.0"
