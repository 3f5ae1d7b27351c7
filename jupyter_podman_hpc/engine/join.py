"""Running a command inside a running container by joining its namespaces.

The fast path of podman-exec mode (as Charliecloud's ``--join`` or
Apptainer's ``--sharens``): instead of one ``podman exec`` per task (a
podman process, ~0.2 s of CPU each), the task enters the namespaces of the
container's first process and copies what ``podman exec`` would give it
from that process, read from the kernel: user and groups, capabilities,
umask, environment, working directory, root, resource limits and cgroups.
Containers this cannot reproduce faithfully (a seccomp filter, an LSM
label) are refused, and the caller falls back to ``podman exec``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
from _collections_abc import Mapping, Sequence  # collections.abc's, loaded with os: this module
# is on every joining task's path and imports only what is built in or already loaded

from ..rank import wait_forwarding

NAMESPACES = ("user", "cgroup", "ipc", "uts", "net", "pid", "mnt")  # user first, mnt last
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522
_RLIMITS = {
    "Max cpu time": resource.RLIMIT_CPU, "Max file size": resource.RLIMIT_FSIZE,
    "Max data size": resource.RLIMIT_DATA, "Max stack size": resource.RLIMIT_STACK,
    "Max core file size": resource.RLIMIT_CORE, "Max processes": resource.RLIMIT_NPROC,
    "Max open files": resource.RLIMIT_NOFILE, "Max locked memory": resource.RLIMIT_MEMLOCK,
    "Max address space": resource.RLIMIT_AS, "Max msgqueue size": resource.RLIMIT_MSGQUEUE,
}


class CannotJoin(Exception):
    """The container has something joining cannot reproduce; use podman exec."""


class JoinFailed(Exception):
    """Joining failed half-way: this process cannot go back, the task fails."""


class Credentials:
    """A process's user, groups, capabilities (CapInh, CapPrm, CapEff, CapBnd, CapAmb) and umask."""

    def __init__(self, uid: int, gid: int, groups: tuple[int, ...], caps: dict[str, int],
                 no_new_privs: bool, umask: int):
        self.uid, self.gid, self.groups, self.caps = uid, gid, groups, caps
        self.no_new_privs, self.umask = no_new_privs, umask


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise JoinFailed(f"{what}: {os.strerror(errno)}")


def _status(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _credentials(pid: int) -> Credentials:
    """The container process's credentials, as the reader's user namespace sees them."""
    status = _status(pid)
    return Credentials(
        uid=int(status["Uid"].split()[0]), gid=int(status["Gid"].split()[0]),
        groups=tuple(int(g) for g in status.get("Groups", "").split()),
        caps={k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        no_new_privs=status.get("NoNewPrivs", "0") == "1", umask=int(status.get("Umask", "0022"), 8),
    )


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        items = environ.read().split(b"\0")
    env = {}
    for item in items:
        key, sep, value = item.decode(errors="surrogateescape").partition("=")
        if sep:
            env[key] = value
    env.pop("HOSTNAME", None)  # podman gives it to the first process only, not to exec'd ones
    return env


def _limits(pid: int) -> dict[int, tuple[int, int]]:
    limits = {}
    with open(f"/proc/{pid}/limits") as text:
        for line in text.readlines()[1:]:
            for label, which in _RLIMITS.items():
                if line.startswith(label):
                    soft, hard = line[len(label):].split()[:2]
                    limits[which] = tuple(resource.RLIM_INFINITY if v == "unlimited" else int(v)
                                          for v in (soft, hard))
    return limits


def _lsm_label(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/attr/current") as label:
            return label.read().strip("\0\n ")
    except OSError:
        return ""


def _drop_bounding_set(bounding: int) -> None:
    for cap in range(64):
        if not bounding >> cap & 1:
            if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
                _check(-1, "dropping a capability")


def _set_caps(caps: dict[str, int]) -> None:
    header = struct.pack("Ii", _CAP_VERSION_3, 0)
    low = lambda v: v & 0xFFFFFFFF  # noqa: E731
    high = lambda v: v >> 32  # noqa: E731
    data = struct.pack("IIIIII", low(caps["CapEff"]), low(caps["CapPrm"]), low(caps["CapInh"]),
                       high(caps["CapEff"]), high(caps["CapPrm"]), high(caps["CapInh"]))
    # libc's wrapper, not syscall(2) with a number: the numbers differ between machines
    _check(_libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)), "setting capabilities")


def _join_cgroups(pid: int) -> None:
    """Best effort, as podman exec: join the container's cgroups where we may."""
    with open(f"/proc/{pid}/cgroup") as theirs, open("/proc/self/cgroup") as ours:
        mine = {line.split(":", 2)[1]: line.split(":", 2)[2].strip() for line in ours}
        for line in theirs:
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


def join_and_run(pid: int, command: Sequence[str], env_overrides: Mapping[str, str] = {},
                 workdir: str | None = None) -> int:
    """Run ``command`` in the container whose first process is ``pid``; its exit code.

    Raises CannotJoin before anything irreversible when the container cannot
    be reproduced faithfully (the caller then uses podman exec), JoinFailed
    if the kernel refuses a step after that.
    """
    if _lsm_label(pid) not in ("", "unconfined"):
        raise CannotJoin("the container has a security label")
    if _status(pid).get("Seccomp", "0") != "0":
        raise CannotJoin("the container has a seccomp filter")
    env = {**_environ(pid), **env_overrides}
    cwd = workdir or os.readlink(f"/proc/{pid}/cwd")
    limits = _limits(pid)
    files = {}
    for kind in NAMESPACES:
        if os.stat(f"/proc/{pid}/ns/{kind}").st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino:
            files[kind] = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
    _join_cgroups(pid)
    if "user" in files:
        _check(_libc.setns(files.pop("user"), 0), "joining the user namespace")
    try:
        # only now: a rootless container's root is a FUSE mount, which
        # refuses processes outside the user namespace that mounted it
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise JoinFailed(f"opening the container's root: {err.strerror}")
    credentials = _credentials(pid)  # now seen from inside the container's user namespace
    for kind, fd in files.items():
        _check(_libc.setns(fd, 0), f"joining the {kind} namespace")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir(cwd)
    for which, (soft, hard) in limits.items():
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass
    os.umask(credentials.umask)
    _drop_bounding_set(credentials.caps["CapBnd"])
    os.setgroups(list(credentials.groups))
    os.setresgid(credentials.gid, credentials.gid, credentials.gid)
    if credentials.uid == 0:
        _set_caps(credentials.caps)
    os.setresuid(credentials.uid, credentials.uid, credentials.uid)
    if credentials.no_new_privs:
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    child = os.fork()  # the pid namespace applies to children
    if child == 0:
        err = _exec(list(command), env)
        os.write(2, f"{command[0]}: {err.strerror}\n".encode())
        os._exit(127 if isinstance(err, FileNotFoundError) else 126)
    return wait_forwarding(child)
