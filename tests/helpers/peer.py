"""podman-hpc 1.2.2, the upstream tool, as a peer: where the stack installed it and the
environment it runs in."""

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Peer:
    bin: Path
    config: Path
    venv: Path


def peer_env(peer: Peer, home: Path) -> dict[str, str]:
    """podman-hpc 1.2.2 needs fuse-overlayfs-wrap, podman and runc on PATH."""
    return {
        **os.environ,
        "PATH": f"{peer.venv / 'bin'}:{os.environ['PATH']}:/usr/bin:/usr/sbin",
        "PODMANHPC_CONFIG_FILE": str(peer.config),
        "PODMANHPC_GRAPH_ROOT": str(home / "storage"),
        "PODMANHPC_RUN_ROOT": str(home / "run"),
        "PODMANHPC_CONFIG_HOME": str(home / "config"),
    }
