"""The podman-hpc engine: everything the CLI and the Jupyter fronts do.

- ``config``: the site configuration (podman_hpc.yaml + PODMANHPC_* variables)
- ``modules``: site modules (modules.d/*.yaml) turned into podman arguments
- ``hostslurm``: the host's Slurm inside a container (the ``slurm`` module's uid shim)
- ``podman``: the one place podman command lines are built and run
- ``statebinds``: the engine's state kept out of every container: the user's own /dev/shm for ``--ipc=host``, binds of state refused
- ``reference``: image reference parsing and validation
- ``store``: the squashed image store's on-disk format (records, squash files, locks)
- ``graphroot``: a podman graph root's records read as podman reads them; ``GraphRoot.find`` matches a reference or id
- ``storeaccess``: which squashed stores apply to the user (own, project, site) and what the user may do with each; writes and removals refused before they start
- ``sharing``: project stores (setgid: their group's), and the modes a store's new files and directories get
- ``records``: the store's records checked as they are read (ids, links)
- ``storefs``: files of a shared store reached through directory descriptors, no link followed
- ``squashcheck``: each squash file's sha256, checked once per file identity on a node
- ``space``: how much room a file system has left (what tells a full disk from another failed write)
- ``migrate``: squashing ("migrating") a local image into the squashed store, and removing it
- ``storeremove``: removing an image (or one of its names) from a squashed store: records first, then files
- ``mount``: the mount program podman calls for squashed images
- ``squashmount``: the mount program's squashfuse mounts, shared by reference and mounted again when they die
- ``readpath``: how a squashed image's files reach its containers on a node (unpacked, kernel, fuse):
  the choice, its settings, the unpack budget, why a node fell back
- ``unpack``: one squash file unpacked into the node-local cache, held while its containers run
- ``unpackcache``: the node-local cache of unpacked copies: what it holds, what is in use, what goes (``sweep``)
- ``kerneloverlay``: kernel overlayfs in podman's user namespace: options, mount(2), the probe
- ``hook``: the OCI hook for modules' ``copy`` entries and ldconfig
- ``inroot``: paths resolved inside a container's root (openat2 RESOLVE_IN_ROOT)
- ``images``: local and squashed images as a user sees them; ``find_squashed`` finds one in the stores
- ``pull``: pulling an image (through the REST service for the fronts, ``podman pull`` for the CLI), then squashing it
- ``build``: building an image through the REST service, with structured progress and cancellation
- ``launcher``: shared-run (podman-exec): a step's tasks on a node, the first one starting its container
- ``stepcontext``: where a task sits in its Slurm step (node, rank, step key, PMI passthrough)
- ``taskplan``: what a task runs in the container (entrypoint, CMD, environment, options)
- ``stepmonitor``: the node's step monitor: serves the other tasks their plan, removes the container
- ``jobcontainer``: a job's node container its steps share (``--reuse``): its locks, adopt or start, linger and removal
- ``perprocess``: per-process mode (one ``podman run`` per task)
- ``join``: running a task inside the node's container by joining its namespaces
- ``service``: the per-user Podman REST service and clients of it
- ``servicestream``: that service's streamed events, its errors, and cancelling what it streams
- ``servicesweep``: private services of callers that died (a server SIGKILLed mid-build) stopped, with what they left
- ``taskrecords``: each background task's state on disk, so the next server lists one cut short as interrupted
- ``progress``: progress events of long operations (pull, build, squash, job wait)
- ``runplan``: how a container run is planned, once for the CLI, the magics and kernels
- ``info``: the ``infohpc`` report (configuration and its sources, stores, read path, modules), as lines
- ``text``: what every front prints alike: sizes, aligned tables, the images table; yes/no words read
- ``commands``: the runner of every external command, which logs each at debug level
- ``errors``: the kinds of error (invalid input, not found, conflict, ...) fronts map
- ``files``: the one atomic write-temp-then-rename; files a container could have written, read as data
  (bounded, no link followed, never blocking on a FIFO)
- ``locks``: an exclusive file lock across processes and threads (flock; containers/storage's lockf)
- ``private``: per-user state directories, made 0700 and verified before each use; why a path is closed to the user
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
    "ConfigError", "ModuleError", "ImageNotFound", "InvalidReference", "PodmanError", "ToolFailed",
]
