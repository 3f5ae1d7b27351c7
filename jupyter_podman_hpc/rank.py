"""The ``podman-hpc`` console script's first stop: a shared-run task that is not its node's first.

Every task of a podman-exec step starts ``podman-hpc shared-run ...``. The
node's first task goes through the whole CLI (configuration, modules, podman)
and starts the step monitor. Every other task only needs the monitor: it sends
its arguments and environment over the step's socket, the monitor (which has
everything loaded) answers with a plan (join the container's first process,
whose pidfd comes with it, or the ``podman exec`` command line), and the task
carries it out. So this module imports only what the interpreter has already
loaded or what is built in (``_socket``, ``_signal``, ``_blake2``, ``marshal``),
not ``socket``/``signal``/``json``/``hashlib``, which pull in ``enum`` and
``re``: that keeps such a task at a few ms of CPU.

The rendezvous is an abstract unix socket: binding it elects the node's first
task and it vanishes with its last holder (a monitor that dies leaves no stale
socket). Abstract names live in the network namespace, which other users of
the node and every ``--network host`` container share, so:

- its name is a keyed hash of the step key (``step_key``) with a per-user
  secret (``key_path``: 0600 in a 0700 directory of the user's cache, made
  once with link() so simultaneous first tasks agree). Other users see a
  step's name in /proc/net/unix only once it is bound, and cannot compute the
  next one, so they cannot bind it first. A file system socket in the run
  root would need the configuration to find it, which such a task never loads;
- both ends check that the other is one of this user's processes on the host:
  the same uid *and* the same user namespace (SO_PEERCRED's pid, pinned with
  SO_PEERPIDFD where the kernel has it). A container of the user maps the
  user's uid but lives in podman's user namespace: it may have read the
  secret (``--home``, ``--jupyter``) and bound a step's name, but a task
  refuses it in one line (exit 125) instead of running its plan on the host;
- a plan must have the expected shape before anything runs: ``podman`` (the
  configured ``podman_bin``, as this task finds it) exec in this step's
  container, with only podman's own variables changed; a join only into a
  process that is in a container (``engine.join``).
"""

from __future__ import annotations

import _blake2
import _signal
import _socket
import fcntl
import marshal
import os
import sys

FORWARDED = (1, 2, 10, 12, 15)  # SIGHUP SIGINT SIGUSR1 SIGUSR2 SIGTERM (the same on every Linux)
_listener = None  # set when this task won the election: the CLI's launcher takes it
_secret: bytes | None = None  # the user's rendezvous key, read once per process
_own_userns: tuple[int, int] | None = None

KEY_SIZE = 32
SO_PEERPIDFD = 77  # Linux >= 6.5: a pidfd of the peer's process (its pid cannot be reused under us)
ENOPROTOOPT = 92
CONNECT_TIMEOUT = 30  # s a connect waits for room in the monitor's backlog (4096): only a squatter fills it
GONE = "gone"  # the peer exited before it could be checked: connect again
NAME_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
CONFIG_FILE = "/etc/podman_hpc/podman_hpc.yaml"  # engine.config's DEFAULT_CONFIG_FILE
# what the monitor may change in the environment podman exec runs with (SiteConfig.podman_env)
PODMAN_ENV_SET = frozenset(("XDG_CONFIG_HOME", "PODMANHPC_SQUASH_READ_PATH", "PODMANHPC_SQUASH_UNPACK_DIR",
                            "PODMANHPC_SQUASH_UNPACK_MAX_MB", "PODMANHPC_SQUASH_UNPACK_IDLE_MINUTES",
                            "PODMANHPC_SQUASH_JOB"))
PODMAN_ENV_UNSET = frozenset(("XDG_RUNTIME_DIR",))
PLAN_KEYS = frozenset(("join", "command", "env", "workdir", "argv", "podman_env"))


class Refused(OSError):
    """This task will not use what it found (a rendezvous, a key, a plan): one line, exit 125."""


# --- names -------------------------------------------------------------------


def step_key(job: str, step: str, node: str) -> str:
    """A step on a node, the one definition: its rendezvous, container and step directory
    derive from it (``launcher.StepContext.key``)."""
    return f"{job}.{step}.{node}"


def node_name(environ) -> str:
    return environ.get("SLURMD_NODENAME") or os.uname().nodename


def container_name(uid: int, key: str) -> str:
    """The node container of step ``key`` (``launcher.StepContext.container_name``)."""
    return f"podman-hpc-{uid}-{''.join(c if c in NAME_SAFE else '_' for c in key)}"


def environ_step_key(environ) -> str | None:
    """This task's step key (None outside a Slurm step)."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    if not job or not step:
        return None
    return step_key(job, step, node_name(environ))


def step_address(environ) -> str | None:
    """The step's rendezvous on this node (None outside a Slurm step)."""
    key = environ_step_key(environ)
    return None if key is None else address_of(key)


def address_of(key: str) -> str:
    """The abstract socket address of a step's monitor (``StepContext.key``): a keyed hash,
    which nobody without the user's secret can compute before the step binds it."""
    digest = _blake2.blake2b(key.encode(), digest_size=16, key=secret()).hexdigest()
    return f"\0podman-hpc/{os.getuid()}/{digest}"


# --- the user's rendezvous key -------------------------------------------------


def key_path(environ) -> str:
    """Where the user's rendezvous key is: in the user's cache, which every node sees and
    other users cannot write (found without the configuration)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or _home(), ".cache")
    return os.path.join(base, "podman-hpc", "rendezvous", "key")


def _home() -> str:
    import pwd  # built in
    return pwd.getpwuid(os.getuid()).pw_dir


def secret() -> bytes:
    """The user's rendezvous key (made on first use)."""
    global _secret
    if _secret is None:
        _secret = load_secret(key_path(os.environ))
    return _secret


def load_secret(path: str) -> bytes:
    """The key at ``path``, created if missing; Refused if it or its directory is not the user's own."""
    _private_dir(os.path.dirname(path))
    for _ in range(3):
        try:
            return _read_key(path)
        except FileNotFoundError:
            _create_key(path)
    raise Refused(f"cannot create the rendezvous key {path}")


def _private_dir(directory: str) -> None:
    """``directory`` exists, is the user's, and nobody else may enter it (0700)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        os.makedirs(directory, 0o700, exist_ok=True)
        st = os.lstat(directory)
    if st.st_mode & 0o170000 != 0o040000:
        raise Refused(f"refusing the rendezvous key's directory {directory}: it is not a directory "
                      f"(a symbolic link?); remove it and run again")
    if st.st_uid != os.getuid():
        raise Refused(f"refusing the rendezvous key's directory {directory}: it belongs to uid {st.st_uid}; "
                      f"remove it and run again")
    if st.st_mode & 0o022:
        raise Refused(f"refusing the rendezvous key's directory {directory}: mode {st.st_mode & 0o777:o} lets "
                      f"others write into it; remove it (rm -rf {directory}) and run again")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)


def _read_key(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise Refused(f"refusing the rendezvous key {path}: not a private file of this user "
                          f"(uid {st.st_uid}, mode {st.st_mode & 0o777:o}); remove it and run again")
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise Refused(f"refusing the rendezvous key {path}: it has {len(data)} bytes, not {KEY_SIZE}; "
                      f"remove it and run again")
    return data


def _create_key(path: str) -> None:
    """Write a fresh key beside ``path`` and link it into place: the first link wins, and a
    reader never sees a partial key (link() is atomic on NFS too)."""
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        os.unlink(partial)  # a crashed process's with our pid
    except FileNotFoundError:
        pass
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.urandom(KEY_SIZE))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(partial, path)
    except FileExistsError:
        pass  # another first task was quicker: everybody reads its key
    finally:
        os.unlink(partial)


# --- the peer ------------------------------------------------------------------


def peer_uid(connection) -> int:
    creds = connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


def peer_problem(connection) -> str | None:
    """Why the other end is not one of this user's own processes on the host: another uid, or
    another user namespace (a container); ``GONE`` if it exited first; None if it is ours.

    For a connecting task the other end is the process that last called listen() on the
    step's socket (the monitor re-listens for that): one that is alive while it is checked.
    """
    creds = connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid = int.from_bytes(creds[0:4], sys.byteorder, signed=True)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid != os.getuid():
        return f"another user (uid {uid})"
    if pid <= 0:
        return "a process outside this task's view (another pid namespace)"
    try:
        pidfd = connection.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as err:
        if err.errno != ENOPROTOOPT:
            return GONE
        pidfd = None  # an older kernel: the pid alone (it could be reused between connect and now)
    try:
        theirs = os.stat(f"/proc/{pid}/ns/user")
        if pidfd is not None:
            _signal.pidfd_send_signal(pidfd, 0)  # still alive, so /proc/<pid> was that process
    except (FileNotFoundError, ProcessLookupError):
        return GONE
    except PermissionError:
        return f"a process of another user namespace (pid {pid})"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if (theirs.st_dev, theirs.st_ino) != own_userns():
        return f"a process in another user namespace (pid {pid}: a container?)"
    return None


def own_userns() -> tuple[int, int]:
    global _own_userns
    if _own_userns is None:
        st = os.stat("/proc/self/ns/user")
        _own_userns = (st.st_dev, st.st_ino)
    return _own_userns


# --- messages ------------------------------------------------------------------


def send(connection, message, fds=()) -> None:
    """One message; ``fds`` (a pidfd) go with its first byte (SCM_RIGHTS)."""
    data = marshal.dumps(message)
    data = len(data).to_bytes(4, "big") + data
    if fds:
        rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        sent = connection.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        data = data[sent:]
    if data:
        connection.sendall(data)


def receive(connection, fds: list | None = None):
    """One message (None if the other end closed first); descriptors that came with it are
    appended to ``fds`` (close-on-exec), or dropped by the kernel when ``fds`` is None."""
    header = _read(connection, 4, fds)
    if header is None:
        return None
    data = _read(connection, int.from_bytes(header, "big"), fds)
    return None if data is None else marshal.loads(data)


def _read(connection, size: int, fds: list | None) -> bytes | None:
    data = b""
    while len(data) < size:
        if fds is None:
            chunk = connection.recv(size - len(data))
        else:
            chunk, ancillary, _, _ = connection.recvmsg(size - len(data), _socket.CMSG_SPACE(16),
                                                        _socket.MSG_CMSG_CLOEXEC)
            for level, kind, payload in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
        if not chunk:
            return None
        data += chunk
    return data


# --- the rendezvous --------------------------------------------------------------


def _high(sock):
    """The socket on a descriptor >= 10: a task moves PMI_FD to 3, which must not be this one."""
    if sock.fileno() >= 10:
        return sock
    moved = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0,
                           fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, 10))
    sock.close()
    return moved


def _connect(address: str):
    """A connection to ``address``; None if nobody listens there (yet, or any more)."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    # a full backlog would block connect() for ever: only a squatter that never accepts fills it
    timeout = CONNECT_TIMEOUT.to_bytes(8, sys.byteorder) + bytes(8)  # struct timeval
    connection.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, timeout)
    try:
        connection.connect(address)
    except OSError as err:
        connection.close()
        if err.errno == 11:  # EAGAIN: the timeout
            raise Refused(f"this step's rendezvous accepted no connection within {CONNECT_TIMEOUT} s: "
                          f"a process that is not the step monitor holds it")
        if err.errno not in (111, 2):  # ECONNREFUSED: bound, not listening yet (or just gone)
            raise
        return None
    connection.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, bytes(16))
    return connection


def rendezvous(address: str):
    """("listener", socket) if this task is the node's first, else ("connection", socket)
    to a monitor that is this user's own; Refused if someone else holds the address."""
    for _ in range(2000):
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            listener.bind(address)
            listener.listen(4096)
            return "listener", _high(listener)
        except OSError as err:
            listener.close()
            if err.errno != 98:  # EADDRINUSE: another task is first
                raise
        connection = _connect(address)
        if connection is None:
            os.sched_yield()
            continue
        problem = peer_problem(connection)
        if problem is None:
            return "connection", _high(connection)
        connection.close()
        if problem is not GONE:
            raise Refused(f"{problem} holds this step's rendezvous: refusing it, nothing was run")
    raise Refused("a process that does not listen holds this step's rendezvous: it is not the step "
                  "monitor; nothing was run")


def take_listener():
    """The listener this task bound as the node's first (once), else None."""
    global _listener
    listener, _listener = _listener, None
    return listener


# --- the plan --------------------------------------------------------------------


def checked_plan(plan, key: str, environ) -> dict:
    """The monitor's plan if it has the shape the monitor gives (see ``launcher.StepMonitor._plan``),
    else Refused: the command runs in this step's container, podman is podman, and podman's
    environment is this task's with only podman's own variables changed."""
    def strings(value) -> bool:
        return type(value) is list and all(type(word) is str for word in value)

    def mapping(value) -> bool:
        return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())

    if type(plan) is not dict or set(plan) != PLAN_KEYS:
        raise Refused("the step monitor's plan is malformed: nothing was run")
    command, argv, podman_env = plan["command"], plan["argv"], plan["podman_env"]
    if not (type(plan["join"]) is bool and strings(command) and command and
            (plan["env"] is None or mapping(plan["env"])) and
            (plan["workdir"] is None or type(plan["workdir"]) is str)):
        raise Refused("the step monitor's plan is malformed: nothing was run")
    tail = [container_name(os.getuid(), key), *command]
    if not (strings(argv) and len(argv) > len(tail) + 1 and argv[-len(tail):] == tail
            and "exec" in argv[1:-len(tail)]):
        raise Refused(f"the step monitor's plan does not podman exec in this step's container: "
                      f"refusing {' '.join(argv[:1]) if strings(argv) else 'it'}, nothing was run")
    if not (type(podman_env) is dict and set(podman_env) == {"set", "unset"} and mapping(podman_env["set"])
            and set(podman_env["set"]) <= PODMAN_ENV_SET and strings(podman_env["unset"])
            and set(podman_env["unset"]) <= PODMAN_ENV_UNSET):
        raise Refused("the step monitor's plan changes more of podman's environment than podman-hpc "
                      "does: nothing was run")
    return plan


def configured_podman(environ) -> str:
    """``podman_bin`` as this task can tell without loading the configuration (the variable,
    else a top-level ``podman_bin:`` line of the site's file, else ``podman``), found on PATH."""
    name = environ.get("PODMANHPC_PODMAN_BIN") or _file_setting(environ, "podman_bin") or "podman"
    if "/" in name:
        return os.path.abspath(name)
    for directory in (environ.get("PATH") or os.defpath).split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise Refused(f"podman not found: {name} (set podman_bin in the site configuration)")


def _file_setting(environ, key: str) -> str | None:
    try:
        with open(environ.get("PODMANHPC_CONFIG_FILE") or CONFIG_FILE) as text:
            lines = text.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{key}:"):
            value = line[len(key) + 1:].split(" #")[0].strip()
            return value[1:-1] if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) > 1 else value
    return None


def check_podman(path: str, environ) -> None:
    """Refused unless ``path`` is the configured podman (the same file)."""
    expected = configured_podman(environ)
    try:
        same = os.path.samestat(os.stat(path), os.stat(expected))
    except OSError:
        same = False
    if not same:
        raise Refused(f"the step monitor's plan runs {path}, not the configured podman ({expected}): "
                      f"refusing it, nothing was run")


def podman_environ(changes, environ) -> dict:
    env = dict(environ)
    for name in changes["unset"]:
        env.pop(name, None)
    env.update(changes["set"])
    return env


def run_plan(plan, pidfds, environ=None) -> int:
    """Carry out the monitor's (checked) plan for this task; its exit code."""
    environ = os.environ if environ is None else environ
    if plan["join"]:
        if len(pidfds) != 1:
            raise Refused("the step monitor's plan joins a container but sent no process of it: nothing was run")
        from .engine import join  # ctypes, resource: cheap and built in
        try:
            return join.join_and_run(pidfds[0], plan["command"], plan["env"], plan["workdir"])
        except (join.CannotJoin, OSError):
            pass  # before anything irreversible: podman exec does it
        except join.JoinFailed as err:
            print(f"Error: shared-run: cannot enter the container: {err}", file=sys.stderr)
            return 125
    argv = plan["argv"]
    check_podman(argv[0], environ)
    env = podman_environ(plan["podman_env"], environ)
    if "PMI_FD" in environ:  # this task's own PMI descriptor, passed on as fd 3 (--preserve-fds 1)
        fd = int(environ["PMI_FD"])
        if fd != 3:
            os.dup2(fd, 3)
        os.set_inheritable(3, True)
        env["PMI_FD"] = "3"
    child = os.fork()
    if child == 0:
        try:
            os.execve(argv[0], argv, env)
        except OSError as err:
            os.write(2, f"Error: podman not found: {argv[0]} ({err.strerror})\n".encode())
        os._exit(127)
    return wait_forwarding(child)


def wait_forwarding(child: int) -> int:
    """Wait for ``child``, passing it the signals a task gets; its exit code (128 + N for signal N)."""
    for signum in FORWARDED:
        _signal.signal(signum, lambda s, _f: os.kill(child, s))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _error_reply(reply) -> tuple[str, int]:
    """The monitor's refusal as one line and an exit code (whatever the peer sent)."""
    message = reply.get("error")
    message = message.splitlines()[0] if type(message) is str and message else "the step monitor refused"
    code = reply.get("code", 125)
    return message, code if type(code) is int and 0 < code < 256 else 125


def shared_run_task(argv: list[str]) -> int | None:
    """Run this task through the step monitor; None if the whole CLI must (first task, no step)."""
    global _listener
    key = environ_step_key(os.environ)
    if key is None:
        return None
    kind, sock = rendezvous(address_of(key))
    if kind == "listener":
        _listener = sock
        return None
    send(sock, {"kind": "plan", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
    pidfds: list[int] = []
    reply = receive(sock, pidfds)
    if reply is None:
        print("Error: shared-run: the step monitor exited", file=sys.stderr)
        return 125
    if type(reply) is not dict:
        raise Refused("the step monitor's answer is malformed: nothing was run")
    if "error" in reply:
        message, code = _error_reply(reply)
        print(f"Error: {message}", file=sys.stderr)
        return code
    plan = checked_plan(reply.get("plan"), key, os.environ)
    return run_plan(plan, pidfds)  # sock stays open: the monitor counts this task until it ends


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["shared-run"] and argv[1:2] not in (["--help"], ["-h"]):
        try:
            code = shared_run_task(argv)
        except OSError as err:
            print(f"Error: shared-run: {err}", file=sys.stderr)
            return 125
        if code is not None:
            return code
    from .cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
