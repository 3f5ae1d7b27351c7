"""The stack's components in the order `up` brings them up."""

from . import host, image, layout, npm, peer, registry, site, slurm, venv
from .proc import say


def up() -> None:
    host.install_packages()
    host.configure_podman()
    host.create_user()
    host.make_checkout_readable()
    host.scratch()
    host.build_bind_shim()
    slurm.up()
    registry.up()
    image.up()
    venv.up()
    npm.up()
    peer.up()
    site.up()
    say("up")


def down() -> None:
    """Stop the daemons `up` started; configuration, caches and data stay."""
    registry.down()
    slurm.down()
    say("down")


def status() -> dict[str, bool]:
    result = {
        "packages": not host.missing_packages(),
        "podman config": host.podman_configured(),
        "user": host.user_ready(),
        "scratch": layout.SCRATCH.is_dir() and layout.PROJECT_DIR.is_dir(),
    }
    result.update(slurm.status())
    result.update(registry.status())
    result.update(image.status())
    result.update(venv.status())
    result.update(npm.status())
    result.update(peer.status())
    result.update(site.status())
    return result


def env() -> dict[str, str]:
    """What tests and users need to reach the stack."""
    return {
        "SLURM_CONF": str(layout.SLURM_CONF),
        "STACK_USER": layout.USER,
        "STACK_USER_HOME": str(layout.USER_HOME),
        # A project group (USER and USER2 are members, OUTSIDER is not) and its directory;
        # `dev/as-user -u USER2 CMD` runs CMD as the second member (as the outsider alike).
        "STACK_USER2": layout.USER2,
        "STACK_OUTSIDER": layout.OUTSIDER,
        "STACK_PROJECT_GROUP": layout.PROJECT_GROUP,
        "STACK_PROJECT_DIR": str(layout.PROJECT_DIR),
        "STACK_VENV": str(layout.VENV),
        "STACK_REGISTRY": layout.REGISTRY,
        "STACK_BASE_IMAGE": layout.BASE_IMAGE,
        "STACK_TINY_IMAGE": layout.TINY_IMAGE,
        "STACK_SCRATCH": str(layout.SCRATCH),
        # As at NERSC: the user's directory on the shared scratch file system;
        # podman-hpc's squashed store defaults to $SCRATCH/storage.
        "SCRATCH": str(layout.SCRATCH / layout.USER),
        # The checkout belongs to root: without this the user's Python would
        # recompile the project on every podman-hpc call.
        "PYTHONPYCACHEPREFIX": str(layout.USER_HOME / ".cache" / "jph-pycache"),
        "STACK_NODES": " ".join(layout.NODES),
        # <dir>/<node>/cpuacct.usage: the CPU nanoseconds of everything the node ran ("" without cgroup v1)
        "STACK_NODE_CGROUPS": str(layout.NODE_CGROUPS) if layout.node_cgroup(layout.NODES[0]) else "",
        "STACK_PARTITION": layout.PARTITION,
        "STACK_LOG": str(layout.LOG),
        # podman-hpc 1.2.2 as a peer: PODMANHPC_CONFIG_FILE=$STACK_PEER_CONFIG $STACK_PEER_BIN ...
        "JPH_CHP": str(npm.CHP_BIN),
        "STACK_PEER_VENV": str(layout.PEER_VENV),
        "STACK_PEER_CONFIG": str(layout.PEER_CONFIG),
        "STACK_PEER_BIN": str(layout.PEER_BIN),
        # the project installed from its wheel with JupyterHub and batchspawner (site.py)
        **site.env(),
    }
