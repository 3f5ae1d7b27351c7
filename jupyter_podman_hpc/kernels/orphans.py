"""Kernel containers whose Jupyter server is gone: labels, the sweep and the watchdog.

Every kernel container carries labels naming its kernel and its owner, the
process that started it (pid and start time, so a recycled pid is not
mistaken for the owner), and the host. Two mechanisms remove a container
whose owner died without shutting it down (``kill -9`` of the server, an
OOM kill, a node's batch job ending):

- the **watchdog**: a tiny process started beside each kernel, in its own
  session, that waits (pidfds, no polling) for either the owner or the
  kernel's ``podman run`` to exit. If the owner goes first it removes the
  container at once; if the kernel goes first it just exits. SIGTERM,
  SIGHUP or SIGINT counts as the owner's end: Slurm ends a batch job by
  signalling all its processes at once, the watchdog with its server. It
  removes the container from a child that has left the job (init adopts it),
  so that the job's SIGKILL after KillWait cannot cut a removal short, and
  tries again until podman says the container is gone.
- the **sweep** (:func:`sweep`), run by the next provisioner in any process
  of the user on the node, before its first kernel: every container with
  our label whose owner is dead is removed. It catches what the watchdog
  could not (a watchdog killed too, a node rebooted with its storage kept).

Run as ``python -m jupyter_podman_hpc.kernels.orphans --owner PID:START
--client PID --name NAME`` for the watchdog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..engine.base.processes import detach, owner_alive, owner_token, wait_any

if TYPE_CHECKING:  # the engine's podman is imported lazily: the watchdog must start fast
    from ..engine.podman import Podman

LABEL = "io.podman-hpc.kernel"
OWNER_LABEL = "io.podman-hpc.kernel.owner"
HOST_LABEL = "io.podman-hpc.kernel.host"
POOL_LABEL = "io.podman-hpc.kernel.pool"  # on containers of a warm pool (see pool.py)
POOL = "pool"  # their kernel label until a kernel adopts them
REMOVE_TRIES = 5  # the watchdog's removals, a second more apart each time
REMOVE_TIMEOUT = 60  # seconds for one podman rm (a lock held by a killed podman never frees)


def labels(kernel_id: str) -> dict[str, str]:
    """The labels of a kernel's container: its kernel id, its owner (this process, ``PID:START``) and this
    host."""
    return {LABEL: kernel_id, OWNER_LABEL: owner_token(), HOST_LABEL: socket.gethostname()}


def pool_labels(kernel_name: str) -> dict[str, str]:
    """A pooled container's: no kernel yet (``pool``), and the kernelspec it waits for."""
    return {**labels(POOL), POOL_LABEL: kernel_name}


def kernel_containers(podman: Podman) -> list[dict]:
    """Every container (running or not) of this user's node storage with our label."""
    result = podman("ps", "--all", "--filter", f"label={LABEL}", "--format", "json", check=False)
    if result.returncode != 0:
        return []
    try:
        return json.loads(result.stdout or "[]") or []
    except ValueError:
        return []


def orphans(containers: Sequence[dict], host: str | None = None) -> list[dict]:
    """The containers whose owner process is gone (on this host)."""
    host = host or socket.gethostname()
    found = []
    for container in containers:
        tags = container.get("Labels") or {}
        if tags.get(HOST_LABEL, host) != host:
            continue  # started on another node sharing this storage: not ours to judge
        if not owner_alive(tags.get(OWNER_LABEL, "")):
            found.append(container)
    return found


def sweep(podman: Podman) -> list[str]:
    """Remove orphaned kernel containers; returns their names."""
    doomed = orphans(kernel_containers(podman))
    names = [(c.get("Names") or [c.get("Id", "")])[0] for c in doomed]
    podman.remove_containers(*names)
    return names


def sweep_environment(environ=None) -> list[str]:
    """:func:`sweep` with the engine configured from ``environ`` (default: this process's),
    for fronts that start no kernel themselves (a server extension at load, a CLI)."""
    from ..engine.podman import Podman
    from ..engine.site.config import load_config

    env = dict(os.environ if environ is None else environ)
    return sweep(Podman(load_config(env), env))


# --- the watchdog ------------------------------------------------------------


def start_watchdog(owner: str, client_pid: int, name: str) -> subprocess.Popen:
    """Start the watchdog of one kernel container (detached from the server's session)."""
    from ..engine.base import commands

    return commands.popen(
        [sys.executable, "-m", __name__, "--owner", owner, "--client", str(client_pid), "--name", name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def wait_first(owner: str, client_pid: int) -> str:
    """Block until the owner or the client exits: "owner" or "client"."""
    return "client" if wait_any([owner, str(client_pid)]) == str(client_pid) else "owner"


# What ends a batch job (scancel, its time limit, the hub's Stop): SIGTERM to every process of the job at
# once, the watchdog with its server, and SIGKILL after KillWait. conmon has left the job's process tree,
# so the container outlives the job unless the watchdog takes a signal as its owner's end.
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class _Ending(Exception):
    """A signal that ends the watchdog (in a batch job, its owner gets it at the same moment)."""


def _raise_ending(signum, frame):
    raise _Ending(signum)


def watchdog(owner: str, client_pid: int, name: str) -> int:
    """Wait until the kernel's owner or its ``podman run`` exits; if the owner went first (or with it),
    or a signal ends the watchdog, remove the container ``name``. 0 either way."""
    for number in _ENDING_SIGNALS:
        signal.signal(number, _raise_ending)
    try:
        first = wait_first(owner, client_pid)
    except _Ending:
        first = "signal"
    for number in _ENDING_SIGNALS:  # nothing interrupts the removal but SIGKILL
        signal.signal(number, signal.SIG_IGN)
    if first == "client" and owner_alive(owner):
        return 0  # the kernel ended while its server lives: the provisioner cleans up
    _leave_the_job()
    from ..engine.podman import Podman
    from ..engine.site.config import load_config

    remove_until_gone(Podman(load_config(os.environ)), name)
    return 0


def _leave_the_job() -> None:
    """Go on in a process that init adopts. Slurm SIGKILLs what is left of a job's process tree
    KillWait seconds after its SIGTERM, and a removal can take longer (waiting for the container's lock,
    held by the server's own clean-up or ``podman run --rm``); a podman killed in the middle of a removal
    leaves the container behind. (Under proctrack/cgroup the child dies with the job anyway: there the
    sweep is the fallback.)"""
    if not detach():
        os._exit(0)


def remove_until_gone(podman: Podman, name: str, tries: int = REMOVE_TRIES) -> bool:
    """``podman rm`` the container ``name`` until podman says it does not exist (another remover may
    hold it, or fail half-way): True once it is gone."""
    for attempt in range(tries):
        with contextlib.suppress(Exception):  # a hung or failing podman: the next try, or the sweep
            podman.run(podman.remove_command(name), check=False, timeout=REMOVE_TIMEOUT)
            if podman("container", "exists", name, check=False, timeout=REMOVE_TIMEOUT).returncode == 1:
                return True
        time.sleep(1 + attempt)
    return False


def main(argv: list[str] | None = None) -> int:
    """The watchdog process's command line (``--owner``, ``--client``, ``--name``); 1 on any error, since
    nobody reads its output (the sweep is the fallback)."""
    parser = argparse.ArgumentParser(prog="python -m jupyter_podman_hpc.kernels.orphans")
    parser.add_argument("--owner", required=True, help="PID:START of the kernel's owner")
    parser.add_argument("--client", required=True, type=int, help="pid of the kernel's podman run")
    parser.add_argument("--name", required=True, help="the kernel container's name")
    args = parser.parse_args(argv)
    try:
        return watchdog(args.owner, args.client, args.name)
    except Exception:  # noqa: BLE001  a watchdog has no one to report to; the sweep is the fallback
        return 1


if __name__ == "__main__":
    sys.exit(main())
