"""The per-user Podman REST service (``podman system service``) and clients of it.

Two kinds of service, both started with the engine's ``Podman`` command
builder, so they use the same HPC storage settings as the CLI (graph root,
run root, mount program, cgroup manager, runtime):

``ApiService`` -- the shared one. One per user and storage configuration on a
node, bound to ``<run_root>/podman-hpc-api-<key>.sock``, started on demand
and reused by every caller while it is alive (``client(config)``; no front
calls it today: they list and run through the ``podman`` CLI). It sees the
squashed store as an additional image store, as ``podman-hpc images``/``run``
do, so images squashed on the shared file system appear in its image list.
It exits by itself after ``idle``
seconds without a request (``--time``). ``<key>`` is a hash of the storage
settings, so callers with a different graph root or squash dir never share a
service whose storage does not match theirs.

Starting it is race-free between threads and processes: "is it alive / start
it / wait until it answers" runs under an ``flock`` on
``<run_root>/podman-hpc-api-<key>.lock``. A socket file nobody answers on
(the service was killed) is removed and a new service started. The service
is detached from the caller: its own session, stdin from /dev/null, stdout
and stderr appended to ``<run_root>/podman-hpc-api-<key>.log``, started
through a short-lived trampoline so it is not the caller's child (no zombie
in a long-lived kernel when it exits on idle).

``PrivateService`` -- one service for one long write operation (a pull or a
build, see ``engine.images.pull`` and ``engine.images.build``). It does *not* see the squashed store, for the
same reason ``podman-hpc pull``/``build`` do not: a pull through a service
that sees it reuses the read-only store's layers and leaves a node-local image
record whose top layer the local storage does not have ("layer not known" for
every later ``podman images``). And because the service runs only that one
operation, the processes of a build's RUN step are exactly the container
processes under it, which is what cancelling a build needs (see ``engine.images.build``).

Never pull, build, tag or remove images through ``ApiService`` (use
``engine.images.pull``, ``engine.images.build``, the CLI or ``engine.images.migrate``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path

from ..base import commands, processes
from ..base.files import atomic_write
from ..base.locks import flocked
from ..base.private import private_dir
from ..errors import ToolFailed
from ..podman import Podman
from ..site.config import SiteConfig
from ..store.squashed import SquashStore

DEFAULT_IDLE = 300  # seconds without a request before the shared service exits
START_TIMEOUT = 60.0  # seconds for a new service to answer
PING_TIMEOUT = 5.0
PRIVATE_IDLE = 120  # a private service outlives a caller that died by this much
QUIET = 2.0  # seconds without activity after which a cut-off operation counts as wound down
LOG_LIMIT = 1 << 20  # the shared service's log is started afresh beyond this size
_SUN_PATH_MAX = 107  # bytes in a unix socket path (sun_path is 108 with the NUL)
OWNER_SUFFIX = ".owner"  # a private service's record of who started it (see PrivateService._record_owner)

# Environment variables that change what podman does with the same flags.
_ENV_KEYS = (
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "CONTAINERS_POLICY_PATH",
    "REGISTRY_AUTH_FILE",
)

# Runs the service detached: a new session, the log as stdout/stderr, and
# this trampoline exits at once so the service is re-parented away from the caller.
_DETACH = """\
import os, subprocess, sys
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
child = subprocess.Popen(sys.argv[3:], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         cwd=sys.argv[2], start_new_session=True)
print(child.pid, flush=True)
"""


class ServiceError(ToolFailed):
    """The Podman API service could not be started or reached."""


def ping(sock: str | os.PathLike, timeout: float = PING_TIMEOUT) -> bool:
    """Whether a Podman service answers ``GET /_ping`` on the unix socket ``sock``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(os.fspath(sock))
            conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            reply = b""
            while chunk := conn.recv(4096):
                reply += chunk
                if len(reply) > 65536:
                    break
    except OSError:
        return False
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[0].startswith(b"HTTP/1.") and status[1] == b"200" and body.strip() == b"OK"


def _kill_tree(pid: int, grace: float = 10.0) -> None:
    """Stop a service we started: SIGTERM its process group, SIGKILL what is left after ``grace``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and processes.running(pid):
        time.sleep(0.05)
    if processes.running(pid):
        for target in [*processes.descendants(pid), pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _run_root(config: SiteConfig) -> Path:
    return private_dir(config.run_root)


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise ServiceError(f"the Podman API socket path {path} is too long for a unix socket: use a shorter run_root")


class ApiService:
    """The shared per-user service: ``ensure()`` it, then connect to ``url``."""

    def __init__(
        self,
        config: SiteConfig,
        *,
        idle: int = DEFAULT_IDLE,
        environ: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT,
    ):
        self.config = config
        self.podman = Podman(config, environ)
        self.idle = int(idle)
        self.start_timeout = start_timeout
        root = Path(config.run_root)
        base = f"podman-hpc-api-{self.key}"
        self.socket = root / f"{base}.sock"
        self.lock_path = root / f"{base}.lock"
        self.log_path = root / f"{base}.log"
        self.pid_path = root / f"{base}.pid"
        _check_socket_path(self.socket)

    @property
    def key(self) -> str:
        """A short hash of everything that decides what storage the service serves."""
        argv = self.podman.command(["system", "service"])
        env = {k: self.podman.env.get(k, "") for k in ("XDG_CONFIG_HOME", *_ENV_KEYS)}
        text = json.dumps([argv, env], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    @property
    def url(self) -> str:
        """The service's address for a podman client (``unix://`` and its socket)."""
        return f"unix://{self.socket}"

    def command(self) -> list[str]:
        """``podman <HPC storage flags> system service --time N unix://<socket>``.

        ``system service`` is not among the subcommands the builder keeps
        away from the squashed store, so the service sees it.
        """
        return self.podman.command(["system", "service"], "--time", str(self.idle), self.url)

    def pid(self) -> int | None:
        """The service's process id, if the one we recorded is still running."""
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if processes.running(pid) and self.url in processes.cmdline(pid):
            return pid
        return None

    def alive(self, timeout: float = PING_TIMEOUT) -> bool:
        """The service answers a ping on its socket within ``timeout`` seconds."""
        return self.socket.is_socket() and ping(self.socket, timeout)

    def _locked(self):
        _run_root(self.config)
        return flocked(self.lock_path, 0o600)

    def ensure(self) -> str:
        """The service's URL, after starting it if nobody answers on its socket."""
        if self.alive():
            return self.url
        with self._locked():
            if self.alive():
                return self.url
            self._clear_stale()
            self._start()
        return self.url

    def _clear_stale(self) -> None:
        """Stop a recorded service that no longer answers, remove its socket file."""
        pid = self.pid()
        if pid is not None:
            _kill_tree(pid, grace=5.0)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def _start(self) -> None:
        if self.config.use_default_args and self.config.squash_dir and not Path(self.config.squash_dir).is_dir():
            # podman refuses to start with an additional image store that does not exist
            # ("can't stat imageStore dir"): a user's first call, before any migrate.
            SquashStore(self.config.squash_dir).init()
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > LOG_LIMIT:
                self.log_path.unlink()
        argv = self.command()
        try:
            result = commands.run(
                [sys.executable, "-c", _DETACH, str(self.log_path), str(_run_root(self.config)), *argv],
                env=self.podman.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=True,
            )
            pid = int(result.stdout.split()[0])
        except FileNotFoundError as err:
            raise ServiceError(f"cannot start the Podman API service: {err.strerror}: {err.filename}")
        except (subprocess.SubprocessError, ValueError, IndexError) as err:
            lines = (getattr(err, "stderr", "") or "").strip().splitlines()
            raise ServiceError(f"cannot start the Podman API service: {lines[-1] if lines else err}")
        self.pid_path.write_text(f"{pid}\n")
        _wait_ready(self.socket, lambda: processes.running(pid), self.log_path, self.start_timeout)

    def stop(self, grace: float = 10.0) -> bool:
        """Stop the service now (tests, administration); whether one was running."""
        with self._locked():
            pid = self.pid()
            if pid is not None:
                _kill_tree(pid, grace)
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            with contextlib.suppress(FileNotFoundError):
                self.pid_path.unlink()
        return pid is not None


def _wait_ready(sock: Path, running, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.is_socket() and ping(sock):
            return
        if not running():
            raise ServiceError(f"the Podman API service exited at start: {_last_line(log_path)}")
        time.sleep(0.02)
    raise ServiceError(f"the Podman API service did not answer on {sock} within {timeout:.0f} s (log: {log_path})")


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return (lines or ["no output"])[-1].removeprefix("Error:").strip()


def ensure_service(config: SiteConfig, *, idle: int = DEFAULT_IDLE, environ: Mapping[str, str] | None = None) -> str:
    """Start the shared service if needed; its ``unix://`` URL."""
    return ApiService(config, idle=idle, environ=environ).ensure()


def client(
    config: SiteConfig,
    *,
    idle: int = DEFAULT_IDLE,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
):
    """A ``podman.PodmanClient`` connected to the shared service (started on demand).

    The service sees node-local and squashed images. Use it for listing,
    inspecting and running; pulls and builds go through ``engine.images.pull`` and ``engine.images.build``.
    """
    from podman import PodmanClient

    return PodmanClient(base_url=ensure_service(config, idle=idle, environ=environ), timeout=timeout)


class PrivateService:
    """A service of our own for one operation, without the squashed store; a context manager.

    ``with PrivateService(config) as svc: svc.client()...``; on exit the
    service and everything under it are stopped.
    """

    def __init__(
        self,
        config: SiteConfig,
        *,
        squashed: bool = False,
        idle: int = PRIVATE_IDLE,
        environ: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT,
    ):
        self.config = config
        self.podman = Podman(config, environ)
        root = Path(config.run_root)
        tag = f"{os.getpid()}-{os.urandom(3).hex()}"
        self.socket = root / f"podman-hpc-op-{tag}.sock"
        self.log_path = root / f"podman-hpc-op-{tag}.log"
        self.owner_path = root / f"podman-hpc-op-{tag}{OWNER_SUFFIX}"
        _check_socket_path(self.socket)
        self.squashed = squashed
        self.idle = int(idle)
        self.start_timeout = start_timeout
        # Read once into a local wherever it is used: a reaper thread (stop) and a stopping server
        # (stop_private_services) may both stop the service, and _stop_now sets it to None.
        self.process: subprocess.Popen | None = None
        self._swap = threading.Lock()  # one of them takes the process to stop it
        self.aborted = False  # set when the operation's connection was cut (see stop)

    @property
    def url(self) -> str:
        """The service's address for a podman client (``unix://`` and its socket)."""
        return f"unix://{self.socket}"

    def command(self) -> list[str]:
        """The ``podman system service`` command line: this service's socket and idle time, with or without
        the squashed store."""
        return self.podman.command(["system", "service"], "--time", str(self.idle), self.url, squashed=self.squashed)

    def start(self) -> PrivateService:
        """Start the service, note its owner for the sweep of orphans, and wait until it answers (the
        service itself returned); ServiceError with its log's last line when it exits, or when it does
        not answer in time."""
        _run_root(self.config)
        with open(self.log_path, "ab") as log:
            self.process = self.podman.popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.config.run_root,
                start_new_session=True,
            )
        self._record_owner()
        _RUNNING.add(self)
        _wait_ready(
            self.socket,
            self._running,
            self.log_path,
            self.start_timeout,
        )
        return self

    def client(self, timeout: float | None = None):
        """A podman client (podman-py) connected to this service."""
        from podman import PodmanClient

        return PodmanClient(base_url=self.url, timeout=timeout)

    def _record_owner(self) -> None:
        """Who started the service, and the service itself, beside its socket: should this process
        die without stopping it (a server SIGKILLed mid-build), the next sweep
        (``engine.service.sweep``) knows it is an orphan and stops it."""
        assert self.process is not None  # called by start() once the service is started
        record = {
            "caller": processes.owner_token(),
            "service": processes.owner_token(self.process.pid),
            "socket": str(self.socket),
            "started": time.time(),
        }
        atomic_write(self.owner_path, json.dumps(record) + "\n", 0o600)

    def _running(self) -> bool:
        """Whether the service's process runs (read once: see ``process``)."""
        process = self.process
        return process is not None and process.poll() is None

    def container_processes(self) -> list[int]:
        """Processes of the containers the service runs right now (a build's RUN step).

        buildah runs each RUN step through a ``buildah-oci-runtime`` child of
        the service, which reaps the container's processes: everything below
        those children.
        """
        process = self.process
        if process is None:
            return []
        table = processes.parents()
        found: list[int] = []
        for pid in processes.descendants(process.pid, table):
            if pid not in found and (processes.cmdline(pid) or [""])[0] == "buildah-oci-runtime":
                found += [p for p in processes.descendants(pid, table) if p not in found]
        return found

    def kill_containers(self) -> int:
        """SIGKILL the container processes under the service; how many were signalled."""
        count = 0
        for pid in self.container_processes():
            try:
                os.kill(pid, signal.SIGKILL)
                count += 1
            except (ProcessLookupError, PermissionError):
                pass
        return count

    def last_log_line(self) -> str:
        """podman's last message (the service logs at the site's log_level)."""
        return _last_line(self.log_path)

    def open_temporary_files(self) -> list[str]:
        """Files the service holds open in the temporary directories image copies use."""
        process = self.process
        if process is None:
            return []
        roots = {"/var/tmp", self.podman.env.get("TMPDIR") or "/var/tmp"}
        return processes.open_files_under([process.pid, *processes.descendants(process.pid)], roots)

    def quiesce(self, timeout: float, quiet: float = QUIET) -> bool:
        """After its client was cut off: let the service wind the operation down; whether it did.

        podman goes on with parts of an operation whose request went away:
        a layer being written into the storage is finished (that part does
        not look at the request's context) before the copy is dropped and
        its ``/var/tmp/storage*`` files removed; a build then fails at its
        next commit, running the RUN step in between. Container processes
        are killed as they appear; the service is quiet once nothing ran
        and no temporary file was open for ``quiet`` seconds.
        """
        deadline = time.monotonic() + timeout
        calm_since = time.monotonic()
        while time.monotonic() < deadline:
            if not self._running():
                return True
            if self.kill_containers() or self.open_temporary_files():
                calm_since = time.monotonic()
            elif time.monotonic() - calm_since >= quiet:
                return True
            time.sleep(0.1)
        return False

    def stop(self, grace: float = 10.0) -> None:
        """Stop the service and remove its socket and log.

        When the operation was cut off (``aborted``), podman may still be
        winding it down: a daemon thread waits for that (``quiesce``) and then
        stops the service, and the caller gets control back at once. Should
        this process exit first, the service's own idle timeout ends it.
        """
        if self.aborted and self._running():
            threading.Thread(target=self._stop_when_quiet, args=(grace,), name="podman-hpc-reaper", daemon=True).start()
            return
        self._stop_now(grace)

    def _stop_when_quiet(self, grace: float) -> None:
        self.quiesce(timeout=max(1.0, self.idle - 5.0))
        self._stop_now(grace)

    def _stop_now(self, grace: float) -> None:
        _RUNNING.discard(self)
        with self._swap:
            process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                _kill_tree(process.pid, grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
        for path in (self.socket, self.log_path, self.owner_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def __enter__(self) -> PrivateService:
        try:
            return self.start()
        except BaseException:
            self.stop(grace=2.0)
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


# this process's private services that are not stopped yet (some winding down in a daemon thread)
_RUNNING: weakref.WeakSet[PrivateService] = weakref.WeakSet()


def stop_private_services(quiet_within: float = 10.0, grace: float = 5.0) -> int:
    """Stop every private service this process started and has not stopped (a server about to
    exit: the daemon threads winding cut-off operations down would die with it and leave their
    services running); one cut off gets ``quiet_within`` seconds to wind down first. How many."""
    services = list(_RUNNING)
    for service in services:
        if service.aborted:
            service.quiesce(timeout=quiet_within)
        service._stop_now(grace)
    return len(services)


__all__ = [
    "DEFAULT_IDLE",
    "ApiService",
    "PrivateService",
    "ServiceError",
    "client",
    "ensure_service",
    "ping",
    "stop_private_services",
]
