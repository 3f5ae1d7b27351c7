"""A job's node container that its steps share (``shared-run --reuse``): found again, started once,
removed after the job's last step on the node.

Without reuse, a podman-exec step's monitor (``stepmonitor``) starts its node's
container and removes it when the step ends there. With reuse, the monitor
*leases* the container its job already has on the node for the same image,
options and modules (``reuse_key``: a digest of the whole ``podman run``
command, so a step with other options, or a module binding per-step paths
such as PMIx's directory, gets a container of its own).

The container's directory (``<run root>/shared-run/<key>``) holds its pid file,
the owner token of its first process, when a step last let go of it, and
three flock files:

- ``create.lock``, exclusive while a monitor adopts the container or starts it
  (``podman run --replace``), so two steps never start two;
- ``holders.lock``, shared by every monitor whose step uses the container;
- ``linger.lock``, held by the one monitor that waits to remove it.

When its step ends on the node, a monitor lets go of its lease and, unless
another monitor already does, lingers: once no step has used the container
for ``shared_run_reuse_linger`` seconds and it can take ``create.lock`` and
``holders.lock`` exclusively (no step uses the container or starts it), it
removes the container and the directory (``linger``). So however many steps
a job runs, one process a node waits. A lingerer first removes the idle
containers of the node whose own lingerer was killed. A later step adopts the container only
if its recorded first process still runs the keep-alive command. Slurm tells
no rootless process that a job has ended, so the container outlives the job's
last step on the node by the linger.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ... import stepsocket
from ..base import processes
from ..base.files import atomic_write
from ..base.locks import held_flock, waited_flock

CREATE = "create.lock"
HOLDERS = "holders.lock"
KEEP_ALIVE = "keep-alive"  # the owner token (pid and start) of the container's first process
LAST_USED = "last-used"  # when a step last let go of it (CLOCK_BOOTTIME seconds)
LINGER = "linger.lock"  # held by the one monitor that waits to remove it
PIDFILE = "container.pid"  # podman run --pidfile


def reuse_key(job: str, node: str, run_words: Sequence[str]) -> str:
    """The key of the job's container on ``node`` for this ``podman run`` command (without its name and pid
    file): its rendezvous-free name and directory derive from it."""
    digest = hashlib.sha256(json.dumps(list(run_words)).encode()).hexdigest()[: stepsocket.DIGEST_SIZE]
    return stepsocket.reuse_key(job, node, digest)


class Lease:
    """A step's hold on the job's container (``holders.lock`` shared) until ``release``."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    def release(self, directory: Path) -> None:
        """Let go (closing the descriptor drops the lock), noting when; again does nothing."""
        if self._fd is not None:
            atomic_write(directory / LAST_USED, str(time.clock_gettime(time.CLOCK_BOOTTIME)), 0o600)
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def starting(directory: Path) -> Iterator[Lease]:
    """Hold ``create.lock`` for the ``with`` block (adopt or start the container in it); yields the
    step's lease, which outlasts the block."""
    create = waited_flock(directory, CREATE, fcntl.LOCK_EX)
    try:
        # never blocks for long: a reaper holds holders.lock only while it also holds create.lock
        yield Lease(waited_flock(directory, HOLDERS, fcntl.LOCK_SH))
    finally:
        os.close(create)


def adopted(directory: Path, keep_alive: Sequence[str]) -> int | None:
    """The pid of the container's first process if it still runs the keep-alive command (held
    ``create.lock``), else None: the container must be started (again)."""
    try:
        token = (directory / KEEP_ALIVE).read_text().strip()
    except OSError:
        return None
    if not processes.owner_alive(token):
        return None
    pid = int(token.partition(":")[0])
    return pid if processes.runs_command(pid, keep_alive) else None


def is_job_container(directory: Path) -> bool:
    """Whether a directory of ``<run root>/shared-run`` is a job's container's (not a step's)."""
    return ".reuse-" in directory.name


def record(directory: Path, pid: int) -> None:
    """Write the owner token of the container's first process, once it runs the keep-alive (held
    ``create.lock``)."""
    atomic_write(directory / KEEP_ALIVE, processes.owner_token(pid), 0o600)


def linger(directory: Path, seconds: float, remove: Callable[[], None], remove_named: Callable[[str], object]) -> None:
    """Be the container's one lingerer, or return at once if another monitor is: wait until no step
    has used the container for ``seconds`` and none uses or starts it, then ``remove()`` it and the
    directory goes. First, the node's job containers whose lingerer was killed go the same way
    (``remove_named(key)``), if they are idle."""
    lingering = held_flock(directory, LINGER, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if lingering is None:
        return
    try:
        node = directory.name.rpartition(".")[2]
        for other in sorted(directory.parent.glob(f"*.reuse-*.{node}")):
            if other != directory:
                _sweep(other, seconds, remove_named)
        while not _removed_if_idle(directory, seconds, remove):
            idle_at = _last_used(directory) + seconds
            now = time.clock_gettime(time.CLOCK_BOOTTIME)
            # a step uses the container (or starts it): look again later; else a step ended meanwhile
            time.sleep(max(seconds, 1.0) if idle_at <= now else idle_at - now)
    finally:
        os.close(lingering)


def _sweep(directory: Path, seconds: float, remove_named: Callable[[str], object]) -> None:
    """Remove another job container of the node if nobody lingers for it and it is idle."""
    lingering = held_flock(directory, LINGER, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if lingering is None:  # its lingerer runs
        return
    try:
        _removed_if_idle(directory, seconds, lambda: remove_named(directory.name))
    finally:
        os.close(lingering)


def _removed_if_idle(directory: Path, seconds: float, remove: Callable[[], object]) -> bool:
    """``remove()`` the container and its directory if no step uses or starts it (both locks taken
    without waiting) and none used it for ``seconds``; whether it did."""
    # (made again if a lingerer before us removed them: then nothing holds them)
    held = [
        fd
        for fd in (held_flock(directory, name, fcntl.LOCK_EX | fcntl.LOCK_NB) for name in (CREATE, HOLDERS))
        if fd is not None
    ]
    try:
        if len(held) < 2 or _last_used(directory) + seconds > time.clock_gettime(time.CLOCK_BOOTTIME):
            return False
        remove()
        for name in (KEEP_ALIVE, PIDFILE, LAST_USED, HOLDERS, CREATE, LINGER):  # the locks last
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()
        return True
    finally:
        for fd in held:
            os.close(fd)


def _last_used(directory: Path) -> float:
    """When a step last let go of the container (boot clock: no wall-clock step moves it); 0 if never."""
    try:
        return float((directory / LAST_USED).read_text())
    except (OSError, ValueError):
        return 0.0
