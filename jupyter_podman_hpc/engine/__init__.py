"""The podman-hpc engine: everything the CLI and the Jupyter fronts do.

- ``config``: the site configuration (podman_hpc.yaml + PODMANHPC_* variables)
- ``modules``: site modules (modules.d/*.yaml) turned into podman arguments
- ``podman``: the one place podman command lines are built and run
- ``reference``: image reference parsing and validation
- ``store``: the squashed image store (migrate, remove, list)
- ``mount``: the mount program podman calls for squashed images
- ``hook``: the OCI hook for modules' ``copy`` entries and ldconfig
- ``images``: local and squashed images, pull
- ``launcher``: shared-run (podman-exec) and per-process launch under Slurm
- ``runplan``: how a container run is planned, once for the CLI, the magics and kernels
- ``commands``: the runner of every external command, which logs each at debug level
- ``errors``: the kinds of error (invalid input, not found, conflict, ...) fronts map
- ``files``: the one atomic write-temp-then-rename
- ``processes``: what the engine asks about a process (psutil)
"""

from .errors import (Conflict, ConfigError, EngineError, ImageNotFound, InvalidInput, InvalidReference,
                     ModuleError, NotFound, PermissionDenied, PodmanError, ToolFailed)


def __getattr__(name: str):
    """The configuration on first use: a task that joins its node's container
    (jupyter_podman_hpc.rank) imports engine.join and must not load it."""
    if name in ("SiteConfig", "load_config"):
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SiteConfig", "load_config",
    "EngineError", "InvalidInput", "NotFound", "Conflict", "PermissionDenied",
    "ConfigError", "ModuleError", "ImageNotFound", "InvalidReference", "PodmanError",
]
