"""Private Podman services whose caller died, stopped, with what they left behind.

A pull or build runs in a ``PrivateService`` started in a session of its own, so
it outlives a caller killed without a chance to stop it (a Jupyter server
SIGKILLed mid-build, a kernel killed mid-pull): the service goes on with the
operation, a build's RUN step keeps running, and when the service is stopped at
last buildah's working container stays in the storage (``podman ps -a
--external``: state "storage"), with its fuse-overlayfs mount.

Each private service leaves ``podman-hpc-op-<tag>.owner`` beside its socket
(who started it, the service itself; see ``PrivateService._record_owner``).
``sweep(config)`` reads those in the run root, trusting only regular files of the
user's own that nobody else may write, and for each whose caller is gone: kills
the service and every process under it, removes its socket, log and record, and
then removes the build containers created while it ran. Build containers are
told apart only by when they were made, so they are left alone while another
private service of the same run root is alive (its build may own them); a later
sweep removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..base import processes
from ..base.files import read_own_json
from ..errors import EngineError
from ..podman import Podman
from ..site.config import SiteConfig
from .rest import OWNER_SUFFIX

GONE_TIMEOUT = 10.0  # seconds for killed processes to be gone


@dataclass(frozen=True)
class ServiceOwner:
    """What ``podman-hpc-op-<tag>.owner`` says."""

    path: Path
    caller: str  # owner token (``PID:START``) of the process that started the service
    service: str  # owner token of the service
    socket: str
    started: float

    @property
    def orphaned(self) -> bool:
        """The process that started the service is gone: the service is left over and may be stopped."""
        return not processes.owner_alive(self.caller)


def read_owners(run_root: str | os.PathLike) -> list[ServiceOwner]:
    """The private services' records in ``run_root`` that can be trusted (others are skipped)."""
    owners = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(Path(run_root).glob(f"podman-hpc-op-*{OWNER_SUFFIX}")):
            owner = _read_owner(path)
            if owner is not None:
                owners.append(owner)
    return owners


def _read_owner(path: Path) -> ServiceOwner | None:
    data = read_own_json(path)
    try:
        socket = Path(str(data["socket"]))
        if socket.parent != path.parent or not socket.name.startswith("podman-hpc-op-"):
            return None  # a record names only a socket beside it
        return ServiceOwner(path, str(data["caller"]), str(data["service"]), str(socket), float(data["started"]))
    except (ValueError, KeyError, TypeError):
        return None


def sweep(config: SiteConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Stop the private services of ``config``'s run root whose caller died; what was removed,
    one line each (for the log)."""
    owners = read_owners(config.run_root)
    orphans = [owner for owner in owners if owner.orphaned]
    if not orphans:
        return []
    done = []
    for owner in orphans:
        done.append(_stop(owner))
    if any(not owner.orphaned for owner in owners):
        return done  # a live build may own the storage's build containers
    first = min(owner.started for owner in orphans)
    done += [f"removed build container {cid[:12]}" for cid in _remove_build_containers(config, environ, first)]
    return done


def _stop(owner: ServiceOwner) -> str:
    pid = int(owner.service.partition(":")[0])
    killed = 0
    if processes.owner_alive(owner.service) and f"unix://{owner.socket}" in processes.cmdline(pid):
        # its children first seen, then all at once: a build's RUN step runs in a session of its own
        targets = [pid, *processes.descendants(pid)]
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
                killed += 1
        deadline = time.monotonic() + GONE_TIMEOUT
        while time.monotonic() < deadline and any(processes.running(t) for t in targets):
            time.sleep(0.05)
    socket = Path(owner.socket)
    for path in (socket, socket.with_suffix(".log"), owner.path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return f"stopped the Podman service {socket.name} of a process that died ({killed} processes)"


def _remove_build_containers(config: SiteConfig, environ: Mapping[str, str] | None, since: float) -> list[str]:
    """Remove buildah's working containers made at or after ``since``; their ids."""
    podman = Podman(config, environ)
    try:
        listed = podman.run(podman.command("ps", "--all", "--external", "--format", "json"), timeout=60)
        containers = json.loads(listed.stdout or "[]")
    except (EngineError, ValueError):
        return []
    ids = [
        str(c.get("Id"))
        for c in containers or []
        if str(c.get("State")) == "storage" and c.get("Id") and float(c.get("Created") or 0) >= int(since) - 1
    ]
    if ids:
        podman.run(podman.remove_command(*ids), check=False, timeout=120)
    return ids


__all__ = ["ServiceOwner", "read_owners", "sweep"]
