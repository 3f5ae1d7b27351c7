"""The mount program podman calls for squashed images, and what it mounts.

- ``program``: the mount program (``podman-hpc-mount``) podman calls for squashed images
- ``squashfuse``: the mount program's squashfuse mounts, shared by reference and mounted again when they die
- ``unpack``: one squash file unpacked into the node-local cache, held while its containers run
- ``cache``: the node-local cache of unpacked copies: what it holds, what is in use, what goes (``sweep``)
- ``kerneloverlay``: kernel overlayfs in podman's user namespace: options, mount(2), the probe
"""


def main() -> None:
    """``podman-hpc-mount``'s old entry point (``jupyter_podman_hpc.engine.mount:main``): the console
    script of an install made before the engine had rooms names it until it is installed again."""
    from .program import main as program_main

    program_main()
