"""The podman-hpc engine: everything the CLI and the Jupyter fronts do.

Its rooms, from the bottom up (each imports only rooms below it; tests/unit/test_layering.py
checks this): the leaves ``errors``, ``progress``, ``text`` and ``reference``; ``base`` (files,
locks, processes, commands); ``site`` (the configuration and modules); ``store`` (the squashed
store); ``mount`` (the mount program and its mounts); ``statebinds`` and ``podman`` (podman
command lines); ``service`` (the REST service) and ``info``; ``images`` (pull, build, squash);
``run`` (containers of Slurm tasks). Each subpackage's docstring lists its modules.

- ``errors``: the kinds of error (invalid input, not found, conflict, ...) fronts map
- ``progress``: progress events of long operations (pull, build, squash, job wait)
- ``text``: what every front prints alike: sizes, aligned tables, the images table; yes/no words read
- ``reference``: image reference parsing and validation
- ``base``: what every room stands on: external commands, files, locks, private directories, processes, space
- ``site``: the site configuration, its modules, the read path's settings, the OCI hook
- ``store``: the squashed image store: its format, its files, who may use which, checks and removal
- ``mount``: the mount program podman calls for squashed images: fuse mounts, unpacked copies, kernel overlay
- ``statebinds``: the engine's state kept out of every container: the user's own /dev/shm for ``--ipc=host``,
  binds of state refused
- ``podman``: the one place podman command lines are built and run
- ``service``: the per-user Podman REST service, its streams, its sweep; the server's task records
- ``info``: the ``infohpc`` report (configuration and its sources, stores, read path, modules), as lines
- ``images``: images as a user sees them; pulling, building and squashing them
- ``run``: running containers for Slurm tasks: the run plan, shared-run, per-process, joining
- ``hook``: the old path of ``site.hook``'s ``main``, which console scripts of an earlier editable install name
"""

from .errors import (
    ConfigError,
    Conflict,
    EngineError,
    ImageNotFound,
    InvalidInput,
    InvalidReference,
    ModuleError,
    NotFound,
    PermissionDenied,
    PodmanError,
    ToolFailed,
)


def __getattr__(name: str):
    """The configuration on first use: a task that joins its node's container
    (jupyter_podman_hpc.rank) imports engine.run.join and must not load it."""
    if name in ("SiteConfig", "load_config"):
        from .site import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "Conflict",
    "EngineError",
    "ImageNotFound",
    "InvalidInput",
    "InvalidReference",
    "ModuleError",
    "NotFound",
    "PermissionDenied",
    "PodmanError",
    "SiteConfig",
    "ToolFailed",
    "load_config",
]
