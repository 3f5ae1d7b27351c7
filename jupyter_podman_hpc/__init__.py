"""jupyter-podman-hpc: podman-hpc's engine, and its Jupyter fronts."""

from .version import __version__  # noqa: F401 - the package's version, as usual

# Jupyter's entry points. They only name modules: importing the package must
# stay cheap and must not need Jupyter (the engine runs on compute nodes).


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The built JupyterLab extension (for `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "jupyter-podman-hpc"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The server extension that the installed jupyter_server config enables."""
    return [{"module": "jupyter_podman_hpc.server"}]


def load_ipython_extension(ipython) -> None:
    """``%load_ext jupyter_podman_hpc``: the ``%podman_hpc`` magics (imported only then)."""
    from .magics import load_ipython_extension as load

    load(ipython)
