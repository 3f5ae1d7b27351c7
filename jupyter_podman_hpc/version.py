"""The package's version (also in pyproject.toml), in a module of its own: the engine
and the fronts read it without importing the package's Jupyter entry points."""

__version__ = "0.1.0"
