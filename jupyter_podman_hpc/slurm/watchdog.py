"""An interactive cluster's watchdog: runs its controller; stops the cluster when the owner or the controller ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..engine import commands
from ..engine.processes import owner_alive, owner_token, wait_any
from .client import SlurmClient, SlurmError
from .clusterrecord import CONTROLLER_LOG, ClusterRecord, connection_files

STOP_GRACE = 5.0                    # seconds between SIGTERM and SIGKILL of the controller


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


def watchdog(owner: str, directory: Path, controller: list[str]) -> int:
    """Run the controller until it exits, the owner dies or we are told to stop; then stop it all.

    The controller runs in a process group of its own; the wait is on pidfds of the owner (the
    kernel) and the controller, and on SIGTERM (``Cluster.stop``), SIGHUP or SIGINT.
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
    wait_any([owner, controller_token], wake_fds=[stop_read])   # a signal writes to stop_write
    stop_parts(directory, record, SlurmClient())
    process.wait()
    with contextlib.suppress(OSError):
        record.update(directory, state="stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
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
