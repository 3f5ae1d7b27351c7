"""The ``podman-hpc`` console script's first stop: a shared-run task that is not its node's first.

Every task of a podman-exec step starts ``podman-hpc shared-run ...``. The
node's first task goes through the whole CLI (configuration, modules, podman)
and starts the step monitor. Every other task only needs the monitor: it sends
its arguments and environment over the step's socket, the monitor (which has
everything loaded) answers with a plan (join the container's first process,
or the ``podman exec`` command line), and the task carries it out. So this
module imports only what the interpreter has already loaded or what is built
in (``_socket``, ``_signal``, ``marshal``), not ``socket``/``signal``/``json``,
which pull in ``enum`` and ``re``: that keeps such a task at a few ms of CPU.

The rendezvous is an abstract unix socket named after the user, job, step and
node (the container's name): binding it elects the node's first task, it
vanishes with its last holder (a monitor that dies leaves no stale socket),
and both ends check that the other is the same user (SO_PEERCRED).
"""

from __future__ import annotations

import _signal
import _socket
import fcntl
import marshal
import os
import sys

FORWARDED = (1, 2, 10, 12, 15)  # SIGHUP SIGINT SIGUSR1 SIGUSR2 SIGTERM (the same on every Linux)
_listener = None  # set when this task won the election: the CLI's launcher takes it


def step_address(environ) -> str | None:
    """The step's rendezvous on this node (None outside a Slurm step)."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    if not job or not step:
        return None
    return address_of(f"{job}.{step}.{environ.get('SLURMD_NODENAME') or os.uname().nodename}")


def address_of(step_key: str) -> str:
    """The abstract socket address of a step's monitor (``StepContext.key``)."""
    return f"\0podman-hpc/{os.getuid()}/{step_key}"


def peer_uid(connection) -> int:
    creds = connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


def send(connection, message) -> None:
    data = marshal.dumps(message)
    connection.sendall(len(data).to_bytes(4, "big") + data)


def receive(connection):
    """One message (None if the other end closed first)."""
    header = _read(connection, 4)
    if header is None:
        return None
    data = _read(connection, int.from_bytes(header, "big"))
    return None if data is None else marshal.loads(data)


def _read(connection, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _high(sock):
    """The socket on a descriptor >= 10: a task moves PMI_FD to 3, which must not be this one."""
    if sock.fileno() >= 10:
        return sock
    moved = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0,
                           fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, 10))
    sock.close()
    return moved


def rendezvous(address: str):
    """("listener", socket) if this task is the node's first, else ("connection", socket)."""
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
        connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            connection.connect(address)
        except OSError as err:  # ECONNREFUSED: bound, not listening yet (or just gone)
            connection.close()
            if err.errno not in (111, 2):
                raise
            os.sched_yield()
            continue
        if peer_uid(connection) != os.getuid():
            connection.close()
            raise OSError(f"another user holds this step's rendezvous {address[1:]!r}")
        return "connection", _high(connection)
    raise OSError(f"no step monitor answered on {address[1:]!r}")


def take_listener():
    """The listener this task bound as the node's first (once), else None."""
    global _listener
    listener, _listener = _listener, None
    return listener


def run_plan(plan, connection) -> int:
    """Carry out the monitor's plan for this task; its exit code."""
    if plan.get("join"):
        from .engine import join  # ctypes, resource: cheap and built in
        try:
            return join.join_and_run(plan["pid"], plan["command"], plan["env"], plan["workdir"])
        except (join.CannotJoin, OSError):
            pass  # before anything irreversible: podman exec does it
        except join.JoinFailed as err:
            print(f"Error: shared-run: cannot enter the container: {err}", file=sys.stderr)
            return 125
    if plan.get("pmi_fd") is not None:
        fd = plan["pmi_fd"]
        if fd != 3:
            os.dup2(fd, 3)
        os.set_inheritable(3, True)
    child = os.fork()
    if child == 0:
        try:
            os.execvpe(plan["argv"][0], plan["argv"], plan["podman_env"])
        except OSError as err:
            os.write(2, f"Error: podman not found: {plan['argv'][0]} ({err.strerror})\n".encode())
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


def shared_run_task(argv: list[str]) -> int | None:
    """Run this task through the step monitor; None if the whole CLI must (first task, no step)."""
    global _listener
    address = step_address(os.environ)
    if address is None:
        return None
    kind, sock = rendezvous(address)
    if kind == "listener":
        _listener = sock
        return None
    send(sock, {"kind": "plan", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
    reply = receive(sock)
    if reply is None:
        print("Error: shared-run: the step monitor exited", file=sys.stderr)
        return 125
    if "error" in reply:
        print(f"Error: {reply['error']}", file=sys.stderr)
        return reply.get("code", 125)
    return run_plan(reply["plan"], sock)  # sock stays open: the monitor counts this task until it ends


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
