"""The step socket: how the tasks of a podman-exec step on a node find their step monitor,
talk to it, and carry out what it plans (the one exec, wait and signal path of every task).

Every task of a podman-exec step starts ``podman-hpc shared-run ...``; all of
them meet at one socket per step and node. This module is that protocol, and
the one way a task runs its command and waits for it. It is a leaf: it imports
only modules built into the interpreter (``_socket``, ``_signal``, ``_blake2``,
``errno``, ``fcntl``, ``marshal``) and ``os``/``sys``, which the interpreter has
loaded already, not ``socket``/``signal``/``json``/``hashlib``, which pull in
``enum`` and ``re``, nor ``__future__`` (0.15 ms: annotations here are evaluated,
as Python >= 3.10 can): a task that is not its node's first imports little
more than this and stays at a few ms of CPU.

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
- both ends check that the other is one of this user's processes on the host
  (``peer_problem``): the same uid *and* the same user namespace. A container
  of the user maps the user's uid but lives in podman's user namespace: it may
  have read the secret (``--home``, ``--jupyter``) and bound a step's name, but
  a task refuses it in one line (exit 125) instead of running its plan on the host.
"""

import _blake2
import _signal
import _socket
import errno
import fcntl
import marshal
import os
import sys

# what a task passes on to its command: SIGHUP SIGINT SIGUSR1 SIGUSR2 SIGTERM
FORWARDED = (_signal.SIGHUP, _signal.SIGINT, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGTERM)
KEY_SIZE = 32
DIGEST_SIZE = 12  # hex digits of a reused container's digest of its image and options
SO_PEERPIDFD = 77  # Linux >= 6.5: a pidfd of the peer's process (its pid cannot be reused under us)
CONNECT_TIMEOUT = 30  # s a connect waits for room in the monitor's backlog (4096): only a squatter fills it
BACKLOG = 4096
GONE = "gone"  # the peer exited before it could be checked: connect again
NAME_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
PMI_FD = 3  # where a task's PMI descriptor goes: podman passes fds 3.. on with --preserve-fds
PRESERVE_PMI_FD = ("--preserve-fds", "1")

_listener = None  # set when the console script won the election: the CLI's launcher takes it
_secret: bytes | None = None  # the user's rendezvous key, read once per process
_own_userns: tuple[int, int] | None = None


class Refused(OSError):
    """This task will not use what it found (a rendezvous, a key, a plan): one line, exit 125."""


# --- names -------------------------------------------------------------------


def step_ids(environ) -> tuple[str, str, str] | None:
    """This task's (job, step, node) from Slurm's variables; None outside a Slurm step."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    if not job or not step:
        return None
    return job, step, node_name(environ)


def step_key(job: str, step: str, node: str) -> str:
    """A step on a node, the one definition: its rendezvous, container and step directory
    derive from it (``stepcontext.StepContext.key``)."""
    return f"{job}.{step}.{node}"


def reuse_key(job: str, node: str, digest: str) -> str:
    """A job's node container that its steps share (``shared-run --reuse``, ``engine.run.jobcontainer``):
    ``digest`` stands for the container's image and options."""
    return step_key(job, f"reuse-{digest}", node)


def reused_by_step(name: str, uid: int, environ) -> bool:
    """Whether ``name`` is a container this task's job shares on this node (``reuse_key``)."""
    ids = step_ids(environ)
    digest = name.rpartition(".reuse-")[2][:DIGEST_SIZE]
    return (
        ids is not None
        and len(digest) == DIGEST_SIZE
        and all(c in "0123456789abcdef" for c in digest)
        and name == container_name(uid, reuse_key(ids[0], ids[2], digest))
    )


def node_name(environ) -> str:
    """This node's name as Slurm calls it (``SLURMD_NODENAME``), else the host name."""
    return environ.get("SLURMD_NODENAME") or os.uname().nodename


def container_name(uid: int, key: str) -> str:
    """The node container of step ``key`` (``stepcontext.StepContext.container_name``)."""
    return f"podman-hpc-{uid}-{''.join(c if c in NAME_SAFE else '_' for c in key)}"


def environ_step_key(environ) -> str | None:
    """This task's step key (None outside a Slurm step)."""
    ids = step_ids(environ)
    return None if ids is None else step_key(*ids)


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


def cache_dir(environ) -> str:
    """The user's podman-hpc cache (``~/.cache/podman-hpc``), which every node sees and other
    users cannot write; found without the configuration."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or _home(), ".cache")
    return os.path.join(base, "podman-hpc")


def key_path(environ) -> str:
    """Where the user's rendezvous key is."""
    return os.path.join(cache_dir(environ), "rendezvous", "key")


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
        raise Refused(
            f"refusing the rendezvous key's directory {directory}: it is not a directory "
            f"(a symbolic link?); remove it and run again"
        )
    if st.st_uid != os.getuid():
        raise Refused(
            f"refusing the rendezvous key's directory {directory}: it belongs to uid {st.st_uid}; "
            f"remove it and run again"
        )
    if st.st_mode & 0o022:
        raise Refused(
            f"refusing the rendezvous key's directory {directory}: mode {st.st_mode & 0o777:o} lets "
            f"others write into it; remove it (rm -rf {directory}) and run again"
        )
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)


def _read_key(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise Refused(
                f"refusing the rendezvous key {path}: not a private file of this user "
                f"(uid {st.st_uid}, mode {st.st_mode & 0o777:o}); remove it and run again"
            )
        data = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_SIZE:
        raise Refused(
            f"refusing the rendezvous key {path}: it has {len(data)} bytes, not {KEY_SIZE}; remove it and run again"
        )
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


def _peer_credentials(connection) -> tuple[int, int]:
    """(pid, uid) of the other end (SO_PEERCRED)."""
    creds = connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[0:4], sys.byteorder, signed=True), int.from_bytes(creds[4:8], sys.byteorder)


def peer_uid(connection) -> int:
    """The uid of the process at the other end of ``connection`` (SO_PEERCRED), which the kernel vouches
    for."""
    return _peer_credentials(connection)[1]


def peer_problem(connection) -> str | None:
    """Why the other end is not one of this user's own processes on the host: another uid, or
    another user namespace (a container); ``GONE`` if it exited first; None if it is ours.

    For a connecting task the other end is the process that last called listen() on the
    step's socket (the monitor re-listens for that): one that is alive while it is checked.
    """
    pid, uid = _peer_credentials(connection)
    if uid != os.getuid():
        return f"another user (uid {uid})"
    if pid <= 0:
        return "a process outside this task's view (another pid namespace)"
    try:
        pidfd = connection.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as err:
        if err.errno != errno.ENOPROTOOPT:
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
    """(device, inode) of this process's user namespace, read once: a peer's must match it."""
    global _own_userns
    if _own_userns is None:
        st = os.stat("/proc/self/ns/user")
        _own_userns = (st.st_dev, st.st_ino)
    return _own_userns


# --- messages: a 4-byte big-endian length, then marshal's bytes ------------------


def frame(message) -> bytes:
    """A message as it goes over the socket."""
    data = marshal.dumps(message)
    return len(data).to_bytes(4, "big") + data


def unframe(buffer: bytes) -> tuple[list, bytes]:
    """The complete messages at the start of ``buffer`` and what remains of it (a reader that
    gets bytes as they come, such as the monitor's selector loop)."""
    messages = []
    while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
        size = int.from_bytes(buffer[:4], "big")
        messages.append(marshal.loads(buffer[4 : 4 + size]))
        buffer = buffer[4 + size :]
    return messages, buffer


def send(connection, message, fds=()) -> None:
    """One message; ``fds`` (a pidfd) go with its first byte (SCM_RIGHTS)."""
    data = frame(message)
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
            chunk, ancillary, _, _ = connection.recvmsg(
                size - len(data), _socket.CMSG_SPACE(16), _socket.MSG_CMSG_CLOEXEC
            )
            for level, kind, payload in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
        if not chunk:
            return None
        data += chunk
    return data


# --- the rendezvous --------------------------------------------------------------


def _high(sock):
    """The socket on a descriptor >= 10: a task moves PMI_FD to 3, which must not be this one."""
    if sock.fileno() >= 10:
        return sock
    moved = _socket.socket(
        _socket.AF_UNIX, _socket.SOCK_STREAM, 0, fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
    )
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
        if err.errno == errno.EAGAIN:  # the timeout
            raise Refused(
                f"this step's rendezvous accepted no connection within {CONNECT_TIMEOUT} s: "
                f"a process that is not the step monitor holds it"
            )
        if err.errno not in (errno.ECONNREFUSED, errno.ENOENT):  # bound, not listening yet (or just gone)
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
            listener.listen(BACKLOG)
            return "listener", _high(listener)
        except OSError as err:
            listener.close()
            if err.errno != errno.EADDRINUSE:  # in use: another task is first
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
    raise Refused(
        "a process that does not listen holds this step's rendezvous: it is not the step monitor; nothing was run"
    )


def keep_listener(listener) -> None:
    """Hold the listener this task bound as the node's first, for the CLI's launcher."""
    global _listener
    _listener = listener


def take_listener():
    """The listener this task bound as the node's first (once), else None."""
    global _listener
    listener, _listener = _listener, None
    return listener


# --- running the task's command ----------------------------------------------------


def pmi_fd_args(environ) -> list[str]:
    """podman's options that pass a task's PMI descriptor on (none without PMI_FD)."""
    return list(PRESERVE_PMI_FD) if "PMI_FD" in environ else []


def move_pmi_fd(environ) -> dict[str, str]:
    """This task's PMI descriptor moved to fd 3, inheritable (podman-hpc's PMI_FD: podman
    passes it with ``--preserve-fds 1``); the variables that say so (none without PMI_FD)."""
    if "PMI_FD" not in environ:
        return {}
    fd = int(environ["PMI_FD"])
    if fd != PMI_FD:
        os.dup2(fd, PMI_FD)
    os.set_inheritable(PMI_FD, True)
    return {"PMI_FD": str(PMI_FD)}


def shell_code(code: int) -> int:
    """An exit code as a shell reports it: a death by signal N (subprocess's -N) is 128 + N."""
    return 128 - code if code < 0 else code


def forward_signals(child: int) -> list[int]:
    """Pass the signals a task gets (``FORWARDED``: srun's, scancel's) on to ``child``; the list of
    those passed so far, which grows as they come."""
    passed: list[int] = []

    def forward(signum, _frame):
        passed.append(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass  # it has exited; its wait status is on its way

    for signum in FORWARDED:
        _signal.signal(signum, forward)
    return passed


def default_signals() -> None:
    """In a child about to exec a task's command: SIGPIPE and SIGXFSZ back to their defaults.
    Python ignores both, and an ignored signal stays ignored across exec (subprocess undoes it
    with restore_signals): a rank's ``yes | head`` would never end, yes getting EPIPE for ever."""
    for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(signum, _signal.SIG_DFL)


def wait_forwarding(child: int) -> int:
    """Wait for ``child``, passing it the signals a task gets; its exit code (128 + N for signal N)."""
    forward_signals(child)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return shell_code(os.waitstatus_to_exitcode(status))


def podman_environ(changes, environ) -> dict:
    """``environ`` with a plan's changes to podman's variables (``SiteConfig.podman_env``)."""
    env = dict(environ)
    for name in changes["unset"]:
        env.pop(name, None)
    env.update(changes["set"])
    return env


def run_plan(plan, pidfd: int | None, environ=None, join=None, log=None) -> int:
    """Carry out a task's (checked) plan, the one path of every task of a node (the first builds
    its plan itself, the others get it from the step monitor); the command's exit code.

    A plan says to join the node container's first process (``pidfd``) or to run ``podman
    exec``. ``join(pidfd, command, env, workdir)`` (``engine.run.join.run_joined``, which a caller
    loads only for a plan that joins) runs the command in the container, or returns None where
    podman exec must. Either way the command runs as this task's child, and the task passes on
    the signals it gets: 128 + N for a death by signal N, as a shell reports it.
    """
    environ = os.environ if environ is None else environ
    if plan["join"] and join is not None:
        code = join(pidfd, plan["command"], plan["env"], plan["workdir"])
        if code is not None:
            return code
    return exec_and_wait(plan["argv"], podman_environ(plan["podman_env"], environ), environ, log)


def exec_and_wait(argv: list[str], env: dict, environ, log=None) -> int:
    """Run ``argv`` (podman) with ``env`` as this task's child, the task's PMI_FD passed on as
    fd 3, and wait forwarding signals; its exit code. ``log(argv, outcome)`` hears its start
    and end where the caller logs commands (the CLI; a task that loaded nothing logs nothing)."""
    env = {**env, **move_pmi_fd(environ)}
    child = os.fork()
    if child == 0:
        try:
            default_signals()
            os.execve(argv[0], argv, env)
        except OSError as err:
            os.write(2, f"Error: podman not found: {argv[0]} ({err.strerror})\n".encode())
        os._exit(127)
    if log is not None:
        log(argv, f"started (pid {child})")
    code = wait_forwarding(child)
    if log is not None:
        log(argv, f"exit {code}")
    return code
