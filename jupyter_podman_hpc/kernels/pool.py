"""Warm pools of container kernels: started ahead of need, adopted by a kernel start.

A container kernelspec with a pool size N (``pool`` in its provisioner
config, ``jupyter podman-hpc kernel install IMAGE --pool N``, or the
server-wide default ``c.PodmanHPC.kernel_pool``, 1 unless configured) keeps N
containers of that kernelspec started in each process that starts its
kernels (a Jupyter server: from its start). Each runs ``boot.py --pool``:
ipykernel and IPython imported (the slow part of a start), waiting on its
stdin for the kernel's connection file, working directory and environment.
A kernel start adopts one (see ``PodmanHPCProvisioner.launch_kernel``) and a
replacement starts in the background.

What a pool can serve: a kernel whose working directory is inside one of
the directories the pool's containers mount (``$HOME`` and the server's
root directory, else the first kernel's working directory), over tcp.
Any other kernel starts on demand, as without a pool.

Nothing outlives the pool's process: pool containers carry the kernel
labels (the sweep of orphans removes them at the next start), each has a
watchdog (the process is SIGKILLed), they are removed at exit (atexit) and
when the kernelspec is removed or changed.

Adoption: ``make`` builds a kernelspec's pool (under ``spec_key``), and a
kernel start hands a pooled container its ``adoption_request``
(``Pooled.hand_over``).
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import json
import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import orphans
from .container import KernelContainer, home, outermost

CHECK_SECONDS = 2.0  # how often a pool checks its kernelspec and its containers
HOLD_SECONDS = 5.0  # a refill waits this long after an adoption (unless the kernel is up sooner)
MAX_FAILURES = 3  # containers in a row that die before they are ready: the pool stops refilling

# for kernelspecs that set no pool size: a Jupyter server sets its c.PodmanHPC.kernel_pool (1 unless
# configured); any other process (a script's KernelManager, nbval) starts kernels on demand
default_size = 0
default_dirs: tuple[str, ...] = ()  # what pool containers mount besides $HOME (the server's root dir)

log = logging.getLogger(__name__)


@dataclass
class Pooled:
    """One started container waiting for its kernel."""

    name: str
    process: subprocess.Popen
    tail: collections.deque
    drain: threading.Thread
    ready: threading.Event
    dirs: tuple[str, ...]
    watchdog: subprocess.Popen | None = None

    def alive(self) -> bool:
        """The container's ``podman run`` is still running."""
        return self.process.poll() is None

    def serves(self, cwd: str) -> bool:
        """A kernel started in ``cwd`` can use this container: ``cwd`` is one of the directories it mounts,
        or below one."""
        path = os.path.realpath(cwd)
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in self.dirs)

    def release(self) -> None:
        """Let the waiter go (EOF on its stdin: it exits without starting a kernel)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass

    def hand_over(self, request: dict) -> bool:
        """Send the waiter its kernel (an ``adoption_request``); False if it cannot take it."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.close()
        except (OSError, ValueError):
            return False
        return True


class Pool:
    """``size`` pooled containers of one kernelspec, kept up by a thread."""

    def __init__(
        self,
        key: str,
        size: int,
        spawn: Callable[[], Pooled],
        remove: Callable[[Sequence[str]], None],
        stamp: Callable[[], bytes | None],
    ):
        self.key = key
        self.size = size
        self._spawn, self._remove, self._stamp = spawn, remove, stamp
        self._initial_stamp = stamp()
        self._entries: list[Pooled] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._hold_until = 0.0
        self._failures = 0
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=f"podman-hpc-kernel-pool-{key[:24]}", daemon=True)
        self._thread.start()

    # --- what kernel starts call ------------------------------------------------

    def take(self, cwd: str) -> Pooled | None:
        """A live pooled container that can serve a kernel working in ``cwd``, or None."""
        with self._lock:
            for entry in self._entries:
                if entry.alive() and entry.serves(cwd):
                    self._entries.remove(entry)
                    self._hold_until = time.monotonic() + HOLD_SECONDS
                    return entry
        return None

    def refill(self) -> None:
        """A kernel of this kernelspec is up: refill now (not while it was starting: they would share
        the cores)."""
        self._hold_until = 0.0
        self._wake.set()

    def names(self) -> list[str]:
        """The names of the containers waiting in the pool now."""
        with self._lock:
            return [entry.name for entry in self._entries]

    def wait_ready(self, timeout: float) -> bool:
        """Until ``size`` containers are ready (benchmarks, tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                ready = sum(1 for e in self._entries if e.alive() and e.ready.is_set())
            if ready >= self.size or self.closed:
                return ready >= self.size
            time.sleep(0.05)
        return False

    # --- upkeep ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self.closed:
            if self._stamp() != self._initial_stamp:
                log.info("podman-hpc: kernelspec of pool %s removed or changed: closing the pool", self.key)
                self.close()
                return
            self._reap()
            if time.monotonic() >= self._hold_until:
                self._fill()
            self._wake.wait(CHECK_SECONDS)
            self._wake.clear()

    def _reap(self) -> None:
        with self._lock:
            dead = [e for e in self._entries if not e.alive()]
            for entry in dead:
                self._entries.remove(entry)
        for entry in dead:
            if not entry.ready.is_set():
                self._failures += 1
            log.warning(
                "podman-hpc: pooled kernel container %s ended (exit %s): %s",
                entry.name,
                entry.process.returncode,
                " | ".join(list(entry.tail)[-3:]) or "no output",
            )
        if dead:
            self._remove([e.name for e in dead])

    def _fill(self) -> None:
        while not self.closed and self._failures < MAX_FAILURES:
            with self._lock:
                if len(self._entries) >= self.size:
                    return
            try:
                entry = self._spawn()
            except Exception as err:  # noqa: BLE001  a pool never breaks kernel starts: they go on demand
                self._failures += 1
                log.warning("podman-hpc: cannot start a pooled kernel container for %s: %s", self.key, err)
                return
            with self._lock:
                self._entries.append(entry)
        if self.closed:  # closed while a container was starting
            self._discard_all()

    def close(self) -> None:
        """Remove every waiting container (adopted ones belong to their kernels)."""
        self.closed = True
        self._wake.set()
        self._discard_all()

    def _discard_all(self) -> None:
        with self._lock:
            doomed, self._entries = self._entries, []
        for entry in doomed:
            entry.release()
        if doomed:
            self._remove([e.name for e in doomed])
            for entry in doomed:
                try:
                    entry.process.wait(10)
                except subprocess.TimeoutExpired:
                    entry.process.kill()


# --- the pools of this process ------------------------------------------------------

_pools: dict[str, Pool] = {}
_registry_lock = threading.Lock()
_atexit_registered = False


def get(key: str, make: Callable[[], Pool]) -> Pool:
    """The open pool under ``key``, made (by ``make``) if there is none."""
    global _atexit_registered
    with _registry_lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            pool = _pools[key] = make()
        if not _atexit_registered:
            atexit.register(close_all)
            _atexit_registered = True
        return pool


def find(key: str) -> Pool | None:
    """The open pool under ``key`` (a kernelspec's), or None."""
    with _registry_lock:
        pool = _pools.get(key)
        return pool if pool is not None and not pool.closed else None


def wait_all_ready(timeout: float) -> bool:
    """Until every open pool of this process has all its containers ready (benchmarks, tests)."""
    with _registry_lock:
        pools = [p for p in _pools.values() if not p.closed]
    deadline = time.monotonic() + timeout
    return all(pool.wait_ready(max(0.0, deadline - time.monotonic())) for pool in pools)


def close_all() -> None:
    """Close every pool of this process, their waiting containers removed (registered to run at exit)."""
    with _registry_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


# --- a kernelspec's pool, and a kernel start adopting one of its containers ----------


def spec_key(spec_file: Path) -> str | None:
    """The key of a kernelspec's pool: its name (its directory's) and a digest of its kernel.json,
    so a changed kernelspec gets a new pool; None when kernel.json cannot be read."""
    try:
        stamp = spec_file.read_bytes()
    except OSError:
        return None
    return f"{spec_file.parent.name}:{hashlib.sha256(stamp).hexdigest()[:16]}"


def make(
    key: str,
    size: int,
    container: KernelContainer,
    spec_file: Path,
    env: dict[str, str],
    cwd: str | None,
    start: Callable[[list[str], dict[str, str], str, Sequence[str]], Pooled],
    logger: logging.Logger | logging.LoggerAdapter,
) -> Pool:
    """A pool of ``size`` containers of the kernelspec ``spec_file`` (run as ``container`` says,
    started by ``start(argv, podman_env, name, dirs)``), mounting $HOME and the server's root
    directory (else ``cwd``)."""
    extra = default_dirs or ((os.path.realpath(cwd),) if cwd else ())
    dirs = outermost([home(), *extra])

    def spawn() -> Pooled:
        name = f"podman-hpc-pool-{uuid.uuid4().hex[:12]}"
        argv, podman_env = container.pool_command(name, orphans.pool_labels(spec_file.parent.name), env, dirs)
        return start(argv, podman_env, name, dirs)

    def stamp() -> bytes | None:
        try:
            return spec_file.read_bytes()
        except OSError:
            return None

    logger.info("podman-hpc: keeping %d kernel(s) of %s started (pool)", size, key)
    return Pool(key, size, spawn, lambda names: container.podman.remove_containers(*names), stamp)


def adoption_request(
    container: KernelContainer,
    connection_file: str,
    cmd: Sequence[str],
    env: dict[str, str],
    cwd: str | None,
    logger: logging.Logger | logging.LoggerAdapter,
) -> dict | None:
    """What a pooled container reads on its stdin to become the kernel ``cmd`` (``boot.py --pool``):
    the connection file (else the one in ``cmd``) and its contents, the working directory, the
    environment and the kernel's arguments; None, with a warning, when the connection file cannot
    be read (the kernel then starts on demand, which mounts it)."""
    argv = container.argv_in_image(cmd)
    connection_file = str(connection_file or argv[argv.index("-f") + 1])
    try:
        info = json.loads(Path(connection_file).read_text())
    except (OSError, ValueError) as err:
        logger.warning("podman-hpc: cannot read the connection file %s: %s", connection_file, err)
        return None
    env_args, values = container.environment(env)
    names = env_args[1::2]
    return {
        "connection_file": connection_file,
        "connection_info": info,
        "cwd": os.path.realpath(cwd) if cwd and os.path.isdir(cwd) else home(),
        "env": {name: values[name] for name in names if name in values},
        "argv": argv[3:],
    }
