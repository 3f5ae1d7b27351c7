"""jupyter-podman-hpc: podman-hpc's engine, and its Jupyter fronts."""

__version__ = "0.1.0"
