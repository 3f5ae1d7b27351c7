"""Running a command inside a running container by joining its namespaces.

The fast path of podman-exec mode (as Charliecloud's ``--join`` or
Apptainer's ``--sharens``): instead of one ``podman exec`` per task (a
podman process, ~0.2 s of CPU each), the task enters the namespaces of the
container's first process and copies what ``podman exec`` would give it
from that process, read from the kernel: user and groups, capabilities,
umask, environment, working directory, root, resource limits and cgroups.
Containers this cannot reproduce faithfully (a seccomp filter, an LSM
label) are refused, and the caller falls back to ``podman exec``.

The process comes as a pidfd (the step monitor's, passed over its socket),
never as a pid number that could meanwhile name another process: its
``/proc`` directory is opened once and checked to be that process while the
pidfd shows it alive, every read goes through that directory, and one
``setns(pidfd, ...)`` enters all its namespaces at once (Linux >= 5.8; older
kernels join them one by one through the same directory). A process that
shares this task's mount namespace is no container: joining it would run the
command on the host, so it is refused.

Before it enters, the task makes itself undumpable (``out_of_reach``): in the
container's user namespace with the container's capabilities, it would
otherwise be open to every process of a ``--pid=host`` container (its
``/proc``, the job's whole environment included, and ptrace). The task's other
processes on the host are out of reach already: the kernel lets a process of
another user namespace into them only with CAP_SYS_PTRACE over them, which no
container has unless given it (the MPI modules drop it).
"""

import ctypes
import errno
import os
import resource
import struct

# collections.abc's, loaded with os: this module is on every joining task's path and imports only
# what is built in or already loaded
from _collections_abc import Mapping, Sequence

from ...stepsocket import default_signals, wait_forwarding

TYPE_CHECKING = False  # typing's flag, which type checkers read as true, without importing typing
if TYPE_CHECKING:  # the stubs know signal's (the same function); _signal, built in, has none
    from signal import pidfd_send_signal
else:
    from _signal import pidfd_send_signal

JOIN_FAILED = 125  # podman's code for errors of the tool itself

# user first, mnt last (when joined one by one); the clone flags setns(pidfd) takes
NAMESPACES = {
    "user": 0x10000000,
    "cgroup": 0x02000000,
    "ipc": 0x08000000,
    "uts": 0x04000000,
    "net": 0x40000000,
    "pid": 0x20000000,
    "mnt": 0x00020000,
}
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522
_RLIMITS = {
    "Max cpu time": resource.RLIMIT_CPU,
    "Max file size": resource.RLIMIT_FSIZE,
    "Max data size": resource.RLIMIT_DATA,
    "Max stack size": resource.RLIMIT_STACK,
    "Max core file size": resource.RLIMIT_CORE,
    "Max processes": resource.RLIMIT_NPROC,
    "Max open files": resource.RLIMIT_NOFILE,
    "Max locked memory": resource.RLIMIT_MEMLOCK,
    "Max address space": resource.RLIMIT_AS,
    "Max msgqueue size": resource.RLIMIT_MSGQUEUE,
}


class CannotJoin(Exception):
    """The container has something joining cannot reproduce; use podman exec."""


class JoinFailed(Exception):
    """Joining failed half-way: this process cannot go back, the task fails."""


class Credentials:
    """A process's user, groups, capabilities (CapInh, CapPrm, CapEff, CapBnd, CapAmb) and umask."""

    def __init__(
        self, uid: int, gid: int, groups: tuple[int, ...], caps: dict[str, int], no_new_privs: bool, umask: int
    ):
        self.uid, self.gid, self.groups, self.caps = uid, gid, groups, caps
        self.no_new_privs, self.umask = no_new_privs, umask


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise JoinFailed(f"{what}: {os.strerror(ctypes.get_errno())}")


def _text(proc: int, name: str, errors: str = "strict") -> str:
    """A file of the process's /proc directory (``proc``, a directory descriptor)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    with open(fd, "rb") as file:
        return file.read().decode(errors=errors)


def _status(proc: int) -> dict[str, str]:
    fields = {}
    for line in _text(proc, "status").splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _credentials(proc: int) -> Credentials:
    """The container process's credentials, as the reader's user namespace sees them."""
    status = _status(proc)
    return Credentials(
        uid=int(status["Uid"].split()[0]),
        gid=int(status["Gid"].split()[0]),
        groups=tuple(int(g) for g in status.get("Groups", "").split()),
        caps={k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        no_new_privs=status.get("NoNewPrivs", "0") == "1",
        umask=int(status.get("Umask", "0022"), 8),
    )


def _environ(proc: int) -> dict[str, str]:
    env = {}
    for item in _text(proc, "environ", "surrogateescape").split("\0"):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    env.pop("HOSTNAME", None)  # podman gives it to the first process only, not to exec'd ones
    return env


def _limit(word: str) -> int:
    return resource.RLIM_INFINITY if word == "unlimited" else int(word)


def _limits(proc: int) -> dict[int, tuple[int, int]]:
    limits = {}
    for line in _text(proc, "limits").splitlines()[1:]:
        for label, which in _RLIMITS.items():
            if line.startswith(label):
                soft, hard = line[len(label) :].split()[:2]
                limits[which] = (_limit(soft), _limit(hard))
    return limits


def _lsm_label(proc: int) -> str:
    try:
        return _text(proc, "attr/current").strip("\0\n ")
    except OSError:
        return ""


def open_process(pidfd: int) -> int:
    """The /proc directory of the pidfd's process, opened once: checked to be that process
    (its pid could name another one by now), and in a container, not beside this task."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            pid = next(int(line.split()[1]) for line in info if line.startswith("Pid:"))
    except (OSError, StopIteration, ValueError, IndexError):
        raise JoinFailed("the step monitor sent no process to join")
    if pid <= 0:
        raise CannotJoin("the container's first process has exited")
    proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        pidfd_send_signal(pidfd, 0)  # alive after the open: /proc/<pid> was this process
    except ProcessLookupError:
        os.close(proc)
        raise CannotJoin("the container's first process has exited")
    return proc


def _namespaces(proc: int) -> list[str]:
    """The namespaces of the process that differ from this task's."""
    return [
        kind
        for kind in NAMESPACES
        if os.stat(f"ns/{kind}", dir_fd=proc).st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino
    ]


def out_of_reach() -> None:
    """Make this process undumpable: only a process with CAP_SYS_PTRACE in the host's user
    namespace may then read its /proc files or ptrace it, whatever namespaces it joins. (execve
    makes the command dumpable again, with only the container's environment.)"""
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "making the task undumpable")


def _drop_bounding_set(bounding: int) -> None:
    for cap in range(64):
        kept = bounding >> cap & 1
        if not kept and _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, "dropping a capability")


def _set_caps(caps: dict[str, int]) -> None:
    header = struct.pack("Ii", _CAP_VERSION_3, 0)
    low = lambda v: v & 0xFFFFFFFF  # noqa: E731
    high = lambda v: v >> 32  # noqa: E731
    data = struct.pack(
        "IIIIII",
        low(caps["CapEff"]),
        low(caps["CapPrm"]),
        low(caps["CapInh"]),
        high(caps["CapEff"]),
        high(caps["CapPrm"]),
        high(caps["CapInh"]),
    )
    # libc's wrapper, not syscall(2) with a number: the numbers differ between machines
    _check(_libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)), "setting capabilities")


def _join_cgroups(proc: int) -> None:
    """Best effort, as podman exec: join the container's cgroups where we may."""
    with open("/proc/self/cgroup") as ours:
        mine = {line.split(":", 2)[1]: line.split(":", 2)[2].strip() for line in ours}
    for line in _text(proc, "cgroup").splitlines():
        _, controllers, path = line.strip().split(":", 2)
        if mine.get(controllers) == path:
            continue
        base = f"/sys/fs/cgroup/{controllers.replace('name=', '')}" if controllers else "/sys/fs/cgroup"
        try:
            with open(f"{base}{path}/cgroup.procs", "w") as procs:
                procs.write(str(os.getpid()))
        except OSError:
            pass


def _exec(command: list[str], env: Mapping[str, str]) -> OSError:
    """execvpe without os.execvpe, which imports a module: in the container, Python's
    standard library is out of reach. Returns the error if no candidate could be run."""
    if "/" in command[0]:
        candidates = [command[0]]
    else:
        path = env.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        candidates = [f"{directory or '.'}/{command[0]}" for directory in path.split(":")]
    error: OSError = FileNotFoundError(2, "No such file or directory")
    for candidate in candidates:
        try:
            os.execve(candidate, command, env)
        except FileNotFoundError:
            continue
        except OSError as err:
            error = err  # e.g. a directory of that name, or not executable: keep looking, as execvp does
    return error


def _enter(pidfd: int, proc: int, kinds: list[str]) -> None:
    """Enter the namespaces ``kinds`` of the process: one setns(pidfd) (Linux >= 5.8), else
    one by one through its /proc directory, the user namespace first."""
    flags = 0
    for kind in kinds:
        flags |= NAMESPACES[kind]
    if _libc.setns(pidfd, flags) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _check(-1, "joining the container's namespaces")
    files = {kind: os.open(f"ns/{kind}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc) for kind in kinds}
    for kind, fd in files.items():
        _check(_libc.setns(fd, 0), f"joining the {kind} namespace")
        os.close(fd)


def join_and_run(
    pidfd: int, command: Sequence[str], env_overrides: Mapping[str, str] | None = None, workdir: str | None = None
) -> int:
    """Run ``command`` in the container whose first process ``pidfd`` is; its exit code.

    Raises CannotJoin before anything irreversible when the container cannot
    be reproduced faithfully (the caller then uses podman exec), JoinFailed
    if the process is not in a container or the kernel refuses a step after that.
    """
    proc = open_process(pidfd)
    kinds = _faithful_namespaces(proc)
    env = {**_environ(proc), **(env_overrides or {})}
    cwd = workdir or os.readlink("cwd", dir_fd=proc)
    limits = _limits(proc)
    out_of_reach()  # before the container's processes can see it as one of theirs
    _join_cgroups(proc)
    _enter(pidfd, proc, kinds)
    root = _open_root(proc)
    credentials = _credentials(proc)  # now seen from inside the container's user namespace
    os.close(proc)
    _change_root(root, cwd)
    _set_limits(limits)
    _assume(credentials)
    return _fork_exec(command, env)


def _faithful_namespaces(proc: int) -> list[str]:
    """The namespaces of a container this task can join faithfully; CannotJoin for one it cannot
    reproduce (a security label, a seccomp filter), JoinFailed for a process that is no container."""
    if _lsm_label(proc) not in ("", "unconfined"):
        raise CannotJoin("the container has a security label")
    if _status(proc).get("Seccomp", "0") != "0":
        raise CannotJoin("the container has a seccomp filter")
    kinds = _namespaces(proc)
    if "mnt" not in kinds:
        raise JoinFailed("the step monitor's process shares this task's mount namespace: it is no container")
    return kinds


def _open_root(proc: int) -> int:
    """The container's root directory, opened once inside its namespaces."""
    try:
        # only now: a rootless container's root is a FUSE mount, which
        # refuses processes outside the user namespace that mounted it
        return os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    except OSError as err:
        raise JoinFailed(f"opening the container's root: {err.strerror}")


def _change_root(root: int, cwd: str) -> None:
    """Into the container's root, then to its working directory."""
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir(cwd)


def _set_limits(limits: dict[int, tuple[int, int]]) -> None:
    """The container's resource limits, each that this task may set."""
    for which, (soft, hard) in limits.items():
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass


def _assume(credentials: Credentials) -> None:
    """The container process's umask, capabilities, groups and ids, in the order the kernel allows."""
    os.umask(credentials.umask)
    _drop_bounding_set(credentials.caps["CapBnd"])
    os.setgroups(list(credentials.groups))
    os.setresgid(credentials.gid, credentials.gid, credentials.gid)
    if credentials.uid == 0:
        _set_caps(credentials.caps)
    os.setresuid(credentials.uid, credentials.uid, credentials.uid)
    if credentials.no_new_privs:
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _fork_exec(command: Sequence[str], env: Mapping[str, str]) -> int:
    """``command`` run in a child (the pid namespace applies to children); its exit code."""
    child = os.fork()
    if child == 0:
        default_signals()  # as podman exec starts it
        error = _exec(list(command), env)
        os.write(2, f"{command[0]}: {error.strerror}\n".encode())
        os._exit(127 if isinstance(error, FileNotFoundError) else 126)
    return wait_forwarding(child)


def run_joined(
    pidfd: int, command: Sequence[str], env_overrides: Mapping[str, str] | None, workdir: str | None
) -> int | None:
    """:func:`join_and_run` as a task's plan uses it (``stepsocket.run_plan``): its exit code,
    None where podman exec must run the command instead (nothing irreversible happened yet), or
    125 with one line on stderr when joining failed half-way."""
    try:
        return join_and_run(pidfd, command, env_overrides, workdir)
    except (CannotJoin, OSError):
        return None
    except JoinFailed as err:
        os.write(2, f"Error: shared-run: cannot enter the container: {err}\n".encode())
        return JOIN_FAILED
