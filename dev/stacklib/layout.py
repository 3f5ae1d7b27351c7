"""Names, paths and ports of the stack: the one place they are defined."""

import hashlib
import json
from pathlib import Path

STATE = Path("/var/lib/jph-stack")
CACHE = Path("/var/cache/jph-stack")
RUN = STATE / "run"
LOG = STATE / "log"
LIB = STATE / "lib"

USER = "hpcuser"
USER_HOME = Path("/home") / USER

# Project stores (one image store a project's members share): a second member
# of the project group, and a user outside it. Tests run as USER and act as
# the others through sudo (SUDOERS lets USER become them, nobody else).
USER2 = "hpcuser2"
OUTSIDER = "hpcoutsider"
PROJECT_GROUP = "jphproj"
# The project's directory on the shared file system: group-owned, setgid, 2770.
PROJECT_DIR = STATE / "project"
SUDOERS = Path("/etc/sudoers.d/jph-stack")

SLURM_DIR = STATE / "slurm"
SLURM_CONF = SLURM_DIR / "slurm.conf"
SLURMDBD_CONF = SLURM_DIR / "slurmdbd.conf"
CLUSTER = "jph"
PARTITION = "debug"
# `STACK_NODES=N dev/stack up` starts N nodes (the scale benchmark runs 16); every other
# command works with the nodes `up` last started, recorded in NODE_COUNT_FILE.
DEFAULT_NODE_COUNT = 4
MAX_NODE_COUNT = 32
NODE_COUNT_FILE = STATE / "node-count"
NODE_CPUS = 16  # the launch benchmark runs 16 tasks a node (the host has 2 cores: they oversubscribe it)
SLURMCTLD_PORT = 16817
SLURMDBD_PORT = 16819
SLURMD_FIRST_PORT = 17001
SRUN_PORT_RANGE = "60001-63000"
NODE_ROOT = STATE / "nodes"
# Each node's processes (slurmd and all it starts: steps, podman, conmon, containers,
# step monitors) stay in a cpuacct cgroup of the node's own, which rootless podman
# cannot leave on cgroup v1: the scale benchmark reads what a step cost each node.
NODE_CGROUPS = Path("/sys/fs/cgroup/cpuacct/jph-stack")

MARIADB_DIR = STATE / "mariadb"
MARIADB_PORT = 16306

REGISTRY_DIR = STATE / "registry"
REGISTRY = "127.0.0.1:5000"

SCRATCH = STATE / "scratch"
VENV = STATE / "venv"

BASE_IMAGE = f"{REGISTRY}/jph/base:bookworm"
BASE_PACKAGES = [
    "python3-ipykernel",
    "openmpi-bin",
    "python3-mpi4py",
    "procps",
    # ipyparallel's dependencies that bookworm has (its python3-ipyparallel, 7.1, is
    # older than the controller the stack's venv runs)
    "python3-decorator",
    "python3-dateutil",
    "python3-tqdm",
]
# Wheels installed over Debian's packages without resolving dependencies: IPython Parallel
# engines at the version pyproject.toml pins for the controller, and the pyzmq it needs
# (bookworm has 24).
BASE_WHEELS = ["ipyparallel==9.2.0", "pyzmq==25.1.2"]
# The cached rootfs is named after what goes into it: a changed list builds a new one.
BASE_ROOTFS_KEY = "v2-" + hashlib.sha256(json.dumps([BASE_PACKAGES, BASE_WHEELS]).encode()).hexdigest()[:12]
BASE_ROOTFS = CACHE / f"base-rootfs-{BASE_ROOTFS_KEY}.tar"

# A busybox image of a few MB, for tests where the image's content does not matter.
TINY_IMAGE = f"{REGISTRY}/jph/tiny:latest"
TINY_ROOTFS_KEY = "v1"
TINY_ROOTFS = CACHE / f"tiny-rootfs-{TINY_ROOTFS_KEY}.tar"

BIND_SHIM = LIB / "bind_loopback.so"

# podman-hpc 1.2.2, the upstream tool, run side by side with ours (peer.py).
PEER_VERSION = "1.2.2"
PEER_VENV = STATE / "peer-venv"
PEER_BIN = PEER_VENV / "bin" / "podman-hpc"
PEER_DIR = STATE / "peer"
PEER_CONFIG = PEER_DIR / "podman_hpc.yaml"
PEER_HOOKS_DIR = PEER_DIR / "hooks.d"
# Its migrate runs a static mksquashfs inside the image, with an option 4.6 added.
MKSQUASHFS_VERSION = "4.6.1"
MKSQUASHFS_STATIC = CACHE / f"mksquashfs-{MKSQUASHFS_VERSION}.static"

CHECKOUT = Path(__file__).resolve().parents[2]


def node_names(count: int) -> list[str]:
    return [f"n{number}" for number in range(1, count + 1)]


def requested_node_count(value: str | None) -> int:
    """How many nodes `up` starts: ``STACK_NODES`` as a count, or as the names `dev/stack env`
    exports (n1 ... nN); DEFAULT_NODE_COUNT when unset. ValueError for anything else."""
    if not value or not value.strip():
        return DEFAULT_NODE_COUNT
    text = value.strip()
    count = int(text) if text.isdigit() else len(text.split())
    if not 1 <= count <= MAX_NODE_COUNT or (not text.isdigit() and text.split() != node_names(count)):
        raise ValueError(f"STACK_NODES must be a node count from 1 to {MAX_NODE_COUNT} (or n1 ... nN), not {value!r}")
    return count


def started_node_count() -> int:
    try:
        return requested_node_count(NODE_COUNT_FILE.read_text())
    except (OSError, ValueError):
        return DEFAULT_NODE_COUNT


NODES = node_names(started_node_count())


def use_nodes(count: int) -> None:
    """`up`: from now on the stack has ``count`` nodes (recorded for the stack's later commands)."""
    global NODES
    NODES = node_names(count)
    STATE.mkdir(parents=True, exist_ok=True)
    NODE_COUNT_FILE.write_text(f"{count}\n")


def nodes_expr() -> str:
    """The nodes as a Slurm host list."""
    return f"n[1-{len(NODES)}]" if len(NODES) > 1 else NODES[0]


def node_cgroup(node: str) -> Path | None:
    """The node's cpuacct cgroup, where the host has cgroup v1's cpuacct hierarchy (host-notes:
    these machines do); None elsewhere."""
    return NODE_CGROUPS / node if NODE_CGROUPS.parent.is_dir() else None


def node_tmp(node: str) -> Path:
    return NODE_ROOT / node / "tmp"


def node_port(node: str) -> int:
    return SLURMD_FIRST_PORT + NODES.index(node)
