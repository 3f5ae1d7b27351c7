"""Starting a kernel container: its attached ``podman run``, its stderr drained, its watchdog.

The same for a kernel started on demand and for a pooled container (``pool.py``):
the ``podman run`` process stays attached, so it lives exactly as long as the
container; its stderr is copied to the server's, keeping the last lines for
error messages (and noticing a pooled container's ready line); and a watchdog
(``orphans``) removes the container if the starting process dies.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import sys
import threading
from collections.abc import Sequence

from ..engine import EngineError
from ..engine.podman import Podman
from . import orphans
from .boot import READY_LINE
from .container import KernelStartError
from .pool import Pooled

STDERR_TAIL = 40  # lines of the container's stderr kept for error messages


def spawn(
    podman: Podman,
    argv: Sequence[str],
    podman_env: dict[str, str],
    name: str,
    dirs: Sequence[str],
    *,
    image: str,
    watchdog: bool,
    log: logging.Logger | logging.LoggerAdapter,
    interactive: bool = False,
) -> Pooled:
    """Start the kernel container ``name`` of ``image`` with ``argv``: its ``podman run``, stderr
    drain and (with ``watchdog``) watchdog; KernelStartError when podman cannot be started."""
    log.debug("podman-hpc: %s", " ".join(argv))
    try:
        process = podman.popen(
            argv,
            env=podman_env,
            stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except EngineError as err:
        raise KernelStartError(f"cannot start a kernel in image {image}: {err}")
    tail: collections.deque = collections.deque(maxlen=STDERR_TAIL)
    ready = threading.Event()
    drain = threading.Thread(
        target=_drain, args=(process.stderr, tail, ready), name=f"podman-hpc-kernel-stderr-{name}", daemon=True
    )
    drain.start()
    guard = None
    if watchdog:
        try:
            guard = orphans.start_watchdog(orphans.owner_token(), process.pid, name)
        except OSError as err:
            log.warning("podman-hpc: no watchdog for kernel container %s: %s", name, err)
    return Pooled(name, process, tail, drain, ready, tuple(dirs), guard)


def _drain(stream, tail: collections.deque, ready: threading.Event | None = None) -> None:
    """Copy the container's stderr to ours, keeping the last lines for error messages;
    a pooled container's ready line sets ``ready`` instead."""
    sink = getattr(sys.stderr, "buffer", None)
    marker = READY_LINE.encode()
    try:
        for raw in iter(stream.readline, b""):
            if ready is not None and not ready.is_set() and raw.rstrip() == marker:
                ready.set()
                continue
            tail.append(raw.decode(errors="replace").rstrip())
            try:
                if sink is not None:
                    sink.write(raw)
                    sink.flush()
                else:
                    sys.stderr.write(raw.decode(errors="replace"))
            except (OSError, ValueError):
                sink = None
    finally:
        try:
            stream.close()
        except OSError:
            pass
