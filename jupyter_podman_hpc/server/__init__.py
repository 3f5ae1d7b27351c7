"""The jupyter_server extension of jupyter-podman-hpc.

Enabled by the `jupyter_podman_hpc` package (see its
`_jupyter_server_extension_points`), through
etc/jupyter/jupyter_server_config.d/jupyter_podman_hpc.json that the wheel
installs. Its handlers and background tasks will be thin translations of
HTTP requests into engine calls.
"""


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_podman_hpc.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    serverapp.log.info("jupyter_podman_hpc server extension loaded")
