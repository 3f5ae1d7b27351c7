"""The site: its configuration, its modules and what they put in a container.

- ``config``: the site configuration (podman_hpc.yaml + PODMANHPC_* variables)
- ``readpath``: how a squashed image's files reach its containers on a node (unpacked, kernel, fuse):
  the choice, its settings, the unpack budget, why a node fell back
- ``modules``: site modules (modules.d/*.yaml) turned into podman arguments
- ``hostslurm``: the host's Slurm inside a container (the ``slurm`` module's uid shim)
- ``hook``: the OCI hook for modules' ``copy`` entries and ldconfig (the ``podman-hpc-hook`` command)
- ``inroot``: paths resolved inside a container's root (openat2 RESOLVE_IN_ROOT)

``data/`` holds the modules a site gets by default (``modules.d``) and their files.
"""
