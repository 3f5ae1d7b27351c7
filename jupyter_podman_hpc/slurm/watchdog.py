"""An interactive cluster's watchdog: runs its controller; stops the cluster when the owner, the controller or
the job ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..engine import commands
from ..engine.processes import owner_alive, owner_token, wait_any
from .client import SlurmClient, SlurmError
from .clusterrecord import CONTROLLER_LOG, ClusterRecord, connection_files

STOP_GRACE = 5.0                    # seconds between SIGTERM and SIGKILL of the controller
JOB_POLL = 10.0                     # seconds between looks at the job: Slurm tells nobody it ended one


def start(owner: str, directory: Path, controller: Sequence[str], env: Mapping[str, str]) -> commands.Process:
    """Start the watchdog of the cluster recorded in ``directory``.

    In a session of its own, so a kernel interrupt (SIGINT to the kernel's process group) spares it.
    """
    return commands.popen(
        [sys.executable, "-m", __name__, "--owner", owner, "--dir", str(directory), "--", *controller],
        env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)


def stop_parts(directory: Path, record: ClusterRecord, client: SlurmClient) -> None:
    """Stop the controller's process group, cancel the job, remove the connection files.

    What the watchdog does at its end; ``Cluster.stop`` and ``cluster.sweep`` do it again for a
    watchdog that died first.
    """
    if record.controller and owner_alive(record.controller):
        pid = int(record.controller.partition(":")[0])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        if not wait_gone(record.controller, STOP_GRACE):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            wait_gone(record.controller, STOP_GRACE)
    with contextlib.suppress(SlurmError):
        client.cancel(record.job_id)
    for path in connection_files(directory, record.cluster_id).values():
        path.unlink(missing_ok=True)


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
    with open(os.open(directory / CONTROLLER_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600), "ab") as log:
        process = commands.popen(controller, cwd=directory, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, process_group=0, close_fds=True)
    controller_token = owner_token(process.pid)
    record.update(directory, watchdog=owner_token(), controller=controller_token)
    job_ended = threading.Event()
    threading.Thread(target=_watch_job, args=(record.job_id, SlurmClient(), stop_write, job_ended),
                     daemon=True).start()
    wait_any([owner, controller_token], wake_fds=[stop_read])   # a signal or the job writes to stop_write
    stopped_by_us = not job_ended.is_set()
    job_ended.set()
    stop_parts(directory, record, SlurmClient())
    process.wait()
    with contextlib.suppress(OSError):
        record.update(directory, state="stopped" if stopped_by_us else "ended")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_podman_hpc.slurm.watchdog --owner T --dir D -- CONTROLLER...``."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}",
                                     description="The watchdog of an interactive cluster's controller.")
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
