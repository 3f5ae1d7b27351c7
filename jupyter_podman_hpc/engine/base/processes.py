"""What the engine needs to know about a process: since when it runs (owner tokens) and whether it
runs a given command line, from /proc; through psutil whether it runs, its command line, what runs
below it, the files it holds open; waiting for the first of several to exit (pidfds); leaving the
caller's process tree (``detach``); and a container's stray conmon and orphaned ``runc init``.

psutil is imported on first use (about 14 ms): a kernel's watchdog, a step
monitor or a service supervisor pays for it only when it looks at a process.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable, Mapping, Sequence


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    import psutil

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # there, but we may not look at it
        return True


def start_time(pid: int) -> str | None:
    """When a running process started, in clock ticks since boot: tells it from a later one given the
    same pid (None if none, or a zombie). Not psutil's create_time: that adds the boot time, which
    the kernel derives from the wall clock, and on this host it moved by 28 s within two hours, so
    a live owner read as gone (a cluster's watchdog then left its controller running)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rpartition(b")")[2].split()
    except OSError:
        return None
    state, ticks = fields[0], fields[19]  # fields 3 and 22 of proc(5), counted after the command name
    return None if state in (b"Z", b"X", b"x") else ticks.decode()


def _wall_clock_start(pid: int) -> str | None:
    """The start time of earlier versions' owner tokens (psutil's create_time, with two decimals)."""
    import psutil

    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def owner_token(pid: int | None = None) -> str:
    """``PID:START`` of a process (this one by default): what owner labels and records hold."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or '0'}"


def owner_alive(token: str) -> bool:
    """The process of an owner token (``PID:START``, or a bare ``PID``: any start) is running."""
    pid, _, start = token.partition(":")
    try:
        number = int(pid)
    except ValueError:
        return False
    current = start_time(number)
    if current is not None and "." in start:  # a token an earlier version wrote (a running kernel's label)
        current = _wall_clock_start(number)
    return current is not None and (not start or current == start)


def wait_any(tokens: Sequence[str], wake_fds: Sequence[int] = ()) -> str | None:
    """Block until one of the processes ``tokens`` name (owner tokens) exits; its token, the
    first in ``tokens`` order when several have. Waits on pidfds: no polling, and no pid reused
    under us once one is open (each is opened first and checked after, so a process that was
    already gone counts at once). A readable descriptor of ``wake_fds`` ends the wait too: None."""
    import select

    pidfds: dict[str, int] = {}
    try:
        for token in tokens:
            try:
                pidfds[token] = os.pidfd_open(int(token.partition(":")[0]))
            except (OSError, ValueError):
                return token
            if not owner_alive(token):
                return token
        poller = select.poll()
        for fd in [*pidfds.values(), *wake_fds]:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}  # retried on EINTR by Python itself (PEP 475)
        return next((token for token, fd in pidfds.items() if fd in ready), None)
    finally:
        for fd in pidfds.values():
            os.close(fd)


def runs_command(pid: int, argv: Sequence[str]) -> bool | None:
    """Whether process ``pid`` runs exactly ``argv`` (read from /proc, without psutil: a step's start
    waits on it); None if it is gone or we may not look at it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read() == ("\0".join(argv) + "\0").encode()
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    """The command line of process ``pid``; empty when it is gone or we may not look at it."""
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def ancestor_pidfd(name: str) -> int | None:
    """A pidfd of this process's nearest ancestor called ``name`` (None if it has none).

    Read from /proc, not through psutil: a step's first task on every node asks this
    before the step can start, and importing psutil alone costs it tens of milliseconds.
    """
    pid = os.getppid()
    try:
        while pid > 1:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
            if text[text.index("(") + 1 : text.rindex(")")] == name:
                return os.pidfd_open(pid)
            pid = int(text[text.rindex(")") + 2 :].split()[1])  # after the name: state, parent pid
    except (OSError, ValueError):
        pass
    return None


def detach() -> bool:
    """Fork a process that init adopts, in a session of its own: False in the caller, True in the new
    process once it is adopted.

    Until then the new process is still in the caller's process tree, which Slurm's proctrack/linuxproc
    SIGKILLs, again and again, as a cancelled step ends. A step monitor or a reaper killed there after it
    began its work would leave that work half done (a step directory, a container): under load the new
    process can run well ahead of the intermediate one's exit.
    """
    child = os.fork()
    if child != 0:
        os.waitpid(child, 0)
        return False
    try:
        os.setsid()
        middle = os.getpid()
        if os.fork() != 0:
            os._exit(0)
    except BaseException:  # noqa: BLE001  a forked child never returns into the caller's code, whatever happened
        os._exit(1)
    try:
        pidfd = os.pidfd_open(middle)
    except ProcessLookupError:  # gone already: we were adopted
        return True
    try:
        if os.getppid() == middle:  # a pidfd is readable once its process has exited and its children moved
            select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
    return True


def parents() -> dict[int, int]:
    """pid -> parent pid of every process we can see (one pass over the process table)."""
    import psutil

    return {
        process.info["pid"]: process.info["ppid"]
        for process in psutil.process_iter(["pid", "ppid"])
        if process.info["ppid"] is not None
    }


def descendants(pid: int, table: Mapping[int, int] | None = None) -> list[int]:
    """Every process below ``pid`` (in ``table``, a :func:`parents`), parents before their children."""
    table = parents() if table is None else table
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    order: list[int] = []
    queue = sorted(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        order.append(child)
        queue += sorted(children.get(child, []))
    return order


def kill_conmon(container: str) -> list[int]:
    """SIGKILL this user's conmon of container ``container`` (conmon's ``-n``) and what runs below it: a
    ``runc init`` waiting for a start that never comes, which a podman killed between creating and starting
    the container leaves behind even once ``podman rm`` has removed the record. Also every orphaned
    ``runc init`` of the user (``orphaned_runc_inits``). The pids killed."""
    infos = _process_infos()
    table = {info["pid"]: info["ppid"] for info in infos if info["ppid"] is not None}
    doomed: list[int] = []
    for info in infos:
        if _is_our_conmon_of(info, container):
            doomed += [info["pid"], *descendants(info["pid"], table)]
    doomed += [pid for pid in _orphaned_runc_inits(infos) if pid not in doomed]
    _kill_each(doomed)
    return doomed


def _is_our_conmon_of(info: dict, container: str) -> bool:
    """Whether the process ``info`` is this user's conmon of container ``container`` (conmon's ``-n``)."""
    args = info["cmdline"] or []
    if info["name"] != "conmon" or not _ours(info) or "-n" not in args:
        return False
    at = args.index("-n")
    return args[at + 1 : at + 2] == [container]


def _kill_each(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids``; one already gone (or not ours to kill) is passed over."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def orphaned_runc_inits() -> list[int]:
    """This user's ``runc init`` processes whose conmon is gone. One waits for a start that never comes
    once its conmon was killed, and nothing else would ever end it. While conmon lives it is their parent
    (a subreaper), and ``runc create`` before that; an orphan's parent is pid 1 or another subreaper."""
    return _orphaned_runc_inits(_process_infos())


def _orphaned_runc_inits(infos: Sequence[dict]) -> list[int]:
    names = {info["pid"]: info["name"] or "" for info in infos}
    return [
        info["pid"]
        for info in infos
        if (info["cmdline"] or [""])[1:] == ["init"]
        and os.path.basename(info["cmdline"][0]) == "runc"
        and _ours(info)
        and names.get(info["ppid"], "") != "conmon"
        and not names.get(info["ppid"], "").startswith("runc")
    ]


def _process_infos() -> list[dict]:
    """One pass over the process table: pid, parent, name, command line and uids of each process."""
    import psutil

    return [process.info for process in psutil.process_iter(["pid", "ppid", "name", "cmdline", "uids"])]


def _ours(info: dict) -> bool:
    return bool(info["uids"]) and info["uids"].real == os.getuid()


def open_files_under(pids: Iterable[int], roots: Iterable[str]) -> list[str]:
    """The regular files the processes hold open below any of the directories ``roots``."""
    import psutil

    prefixes = tuple(root.rstrip("/") + "/" for root in roots)
    found: list[str] = []
    for pid in pids:
        try:
            found += [f.path for f in psutil.Process(pid).open_files() if f.path.startswith(prefixes)]
        except psutil.Error:
            continue
    return found
