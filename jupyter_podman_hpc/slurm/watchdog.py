"""An interactive cluster's watchdog: runs its controller; stops the cluster when the owner, the controller or
the job ends. What it and every other stop signal is first checked to be the cluster's own (``runs_part``)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..engine.base import commands
from ..engine.base.processes import cmdline, owner_alive, owner_token, wait_any
from .client import SlurmClient, SlurmError
from .clusterrecord import CONTROLLER_LOG, PROFILE, ClusterError, ClusterRecord, remove_connection_files

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of the controller
JOB_POLL = 10.0  # seconds between looks at the job: Slurm tells nobody it ended one
MODULE = f"{__package__}.watchdog"  # what ``python -m`` runs (``__name__`` is "__main__" in the watchdog)


def start(owner: str, directory: Path, controller: Sequence[str], env: Mapping[str, str]) -> commands.Process:
    """Start the watchdog of the cluster recorded in ``directory``.

    In a session of its own, so a kernel interrupt (SIGINT to the kernel's process group) spares it.
    """
    return commands.popen(
        [sys.executable, "-m", MODULE, "--owner", owner, "--dir", str(directory.absolute()), "--", *controller],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def runs_part(token: str, directory: Path, part: str) -> bool:
    """Whether the process of owner token ``token`` is the ``part`` ("controller" or "watchdog") of the
    cluster in ``directory``: alive since that start, the leader of its own process group (each is started
    in one), running the command line this cluster started it with. A token read from a record the
    engines could have written may name any process of the user's; only these are ever signalled."""
    if not token or not owner_alive(token):
        return False
    pid = int(token.partition(":")[0])
    if not _leads_its_group(pid):
        return False
    runs = _runs_controller if part == "controller" else _runs_watchdog
    return runs(cmdline(pid), directory)


def _leads_its_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _runs_controller(argv: list[str], directory: Path) -> bool:
    """``argv`` is ipyparallel's controller with this cluster's profile directory."""
    profiles = [Path(arg.partition("=")[2]) for arg in argv if arg.startswith("--profile-dir=")]
    return _follows(argv, "-m", "ipyparallel.controller") and any(
        profile.name == PROFILE and _same_dir(str(profile.parent), directory) for profile in profiles
    )


def _runs_watchdog(argv: list[str], directory: Path) -> bool:
    """``argv`` is the watchdog of this cluster's directory."""
    named = [value for flag, value in itertools.pairwise(argv) if flag == "--dir"]
    return _follows(argv, "-m", MODULE) and any(_same_dir(value, directory) for value in named)


def _follows(argv: list[str], first: str, second: str) -> bool:
    return any(argv[i : i + 2] == [first, second] for i in range(len(argv) - 1))


def _same_dir(path: str, directory: Path) -> bool:
    return os.path.isabs(path) and os.path.realpath(path) == os.path.realpath(directory)


def stop_parts(directory: Path, record: ClusterRecord, client: SlurmClient) -> None:
    """Stop the controller's process group, cancel the job, remove the connection files.

    What the watchdog does at its end; ``Cluster.stop`` and ``cluster.sweep`` do it again for a
    watchdog that died first. The controller is stopped only if it is this cluster's (``runs_part``),
    and the job cancelled only if the record is the host's (``ClusterRecord.read``).
    """
    if runs_part(record.controller, directory, "controller"):
        pid = int(record.controller.partition(":")[0])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        if not wait_gone(record.controller, STOP_GRACE):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            wait_gone(record.controller, STOP_GRACE)
    if record.job_id:
        with contextlib.suppress(SlurmError):
            client.cancel(record.job_id)
    remove_connection_files(directory, record.cluster_id)


def _controller_log(directory: Path):
    """The controller's log, open for appending: a regular file, never reached through a link, nor a FIFO
    (O_NONBLOCK: an open for writing fails at once when nothing reads it) that the engines planted."""
    refused = ClusterError(f"{directory / CONTROLLER_LOG} is not a regular file: the controller was not started")
    try:
        fd = os.open(
            directory / CONTROLLER_LOG,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
        )
    except OSError as err:
        raise refused if err.errno in (errno.ELOOP, errno.ENXIO) else err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refused
    os.set_blocking(fd, True)
    return open(fd, "ab")


def wait_gone(token: str, timeout: float) -> bool:
    """Wait until the process of an owner token is gone; False if it still runs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while owner_alive(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _watch_job(job_id: str, client: SlurmClient, wake: int, ended: threading.Event) -> None:
    """Set ``ended`` and write to ``wake`` once Slurm no longer has the job (its time limit, a node
    failure, scancel from elsewhere): its engines are gone, the controller then serves nobody."""
    while not ended.is_set():
        time.sleep(JOB_POLL)
        with contextlib.suppress(SlurmError):
            if not client.in_queue(job_id):
                ended.set()
                os.write(wake, b"j")


def watchdog(owner: str, directory: Path, controller: list[str]) -> int:
    """Run the controller until it exits, the owner dies, the job ends or we are told to stop; then
    stop it all. The record's state says ``ended`` when the job ended first, else ``stopped``.

    The controller runs in a process group of its own; the wait is on pidfds of the owner (the
    kernel) and the controller, on SIGTERM (``Cluster.stop``), SIGHUP or SIGINT, and on the job.
    """
    stop_read, stop_write = os.pipe()
    os.set_blocking(stop_write, False)
    signal.set_wakeup_fd(stop_write)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    record = ClusterRecord.read(directory)
    with _controller_log(directory) as log:
        process = commands.popen(
            controller,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            close_fds=True,
        )
    controller_token = owner_token(process.pid)
    record.update(directory, watchdog=owner_token(), controller=controller_token)
    job_ended = threading.Event()
    threading.Thread(target=_watch_job, args=(record.job_id, SlurmClient(), stop_write, job_ended), daemon=True).start()
    wait_any([owner, controller_token], wake_fds=[stop_read])  # a signal or the job writes to stop_write
    stopped_by_us = not job_ended.is_set()
    job_ended.set()
    stop_parts(directory, record, SlurmClient())
    process.wait()
    with contextlib.suppress(OSError):
        record.update(directory, state="stopped" if stopped_by_us else "ended")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_podman_hpc.slurm.watchdog --owner T --dir D -- CONTROLLER...``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {__name__}", description="The watchdog of an interactive cluster's controller."
    )
    parser.add_argument("--owner", required=True, help="PID:START of the process that owns the cluster")
    parser.add_argument("--dir", required=True, type=Path, help="the cluster's job directory")
    parser.add_argument("controller", nargs=argparse.REMAINDER, help="-- the controller's command line")
    args = parser.parse_args(argv)
    controller = args.controller[1:] if args.controller[:1] == ["--"] else args.controller
    if not controller:
        parser.error("give the controller's command line after --")
    return watchdog(args.owner, args.dir, controller)


if __name__ == "__main__":
    sys.exit(main())
