"""The mount program's squashfuse mounts: one per squash file and mount namespace, shared by reference.

Containers of the same image start and stop in any order: each holds a
shared flock on the mount's reference file while its overlay exists, and
the last one to leave unmounts. A squash file is mounted on a directory of
its own beside those files, not on its layer's directory in the store:
podman stats that directory before it calls the mount program, so a dead
mount there would fail every later container of the image. A mount whose
squashfuse died (killed, crashed: every access then fails with ENOTCONN) is
detached and mounted again by the next container; the ones still on it
keep failing visibly.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from ..base import commands
from ..base.private import own_dir
from ..site.readpath import node_state_dir

MOUNTS_DIR = "squash-mounts"


def log(message: str) -> None:
    """The mount program's diagnostics, appended to the file ``LOG`` names (podman-hpc's knob)."""
    target = os.environ.get("LOG")
    if target:
        with open(target, "a") as out:
            out.write(f"[podman-hpc-mount {os.getpid()}] {message}\n")


def mounted_targets() -> set[str]:
    """The mount points of this mount namespace, unescaped."""
    targets = set()
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            # the mount point is field 5; spaces and the like are octal-escaped
            targets.add(line.split()[4].encode().decode("unicode_escape"))
    return targets


def squashfuse() -> str:
    """The squashfuse program: ``SQUASHFUSE_BIN``, else squashfuse_ll (faster), else squashfuse."""
    configured = os.environ.get("SQUASHFUSE_BIN")
    if configured:
        return configured
    return shutil.which("squashfuse_ll") or shutil.which("squashfuse") or "squashfuse"


def dead(target: Path) -> bool:
    """True if ``target`` is a fuse mount whose process is gone."""
    try:
        os.stat(target)
    except OSError as err:
        return err.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


class SquashMount:
    """One squash file, standing for the lower directory ``lower``, mounted on ``<state>/<key>.mnt``
    and shared by reference.

    Users hold a shared flock on ``<state>/<key>.ref`` for as long as their
    overlay exists; mounting and unmounting happen under ``<state>/<key>.mutex``.
    """

    def __init__(self, squash: Path, lower: Path, state_dir: Path):
        self.squash = squash
        key = hashlib.sha256(os.path.realpath(lower).encode()).hexdigest()[:32]
        self.target = state_dir / f"{key}.mnt"
        self.mutex_path = state_dir / f"{key}.mutex"
        self.ref_path = state_dir / f"{key}.ref"
        self.ref_fd: int | None = None
        self.revived = False  # acquire() found the mount dead and mounted it again

    def _mutex(self) -> int:
        fd = os.open(self.mutex_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def acquire(self) -> None:
        """Hold a reference to the mount, mounting it (again, if its squashfuse died) when needed;
        SystemExit with one line if squashfuse cannot mount the file."""
        mutex = self._mutex()
        try:
            self.ref_fd = os.open(self.ref_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.ref_fd, fcntl.LOCK_SH)
            mounted = str(self.target) in mounted_targets()
            if mounted and dead(self.target):
                log(f"{self.target}: its squashfuse is gone, mounting {self.squash} again")
                unmount(str(self.target))  # busy under the containers still on it: detached
                self.revived, mounted = True, False
            if not mounted:
                self.target.mkdir(mode=0o700, exist_ok=True)
                log(f"mount {self.squash} on {self.target}")
                result = commands.run(
                    [squashfuse(), str(self.squash), str(self.target)], capture_output=True, text=True
                )
                if result.returncode != 0:
                    self._drop_ref()
                    raise SystemExit(
                        f"podman-hpc-mount: cannot mount {self.squash}: {(result.stderr or result.stdout).strip()}"
                    )
        finally:
            os.close(mutex)

    def _drop_ref(self) -> None:
        if self.ref_fd is not None:
            os.close(self.ref_fd)
            self.ref_fd = None

    def release(self) -> None:
        """Drop our reference; unmount when nobody else holds one."""
        mutex = self._mutex()
        try:
            self._drop_ref()
            probe = os.open(self.ref_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another container still uses it
            finally:
                os.close(probe)
            if str(self.target) in mounted_targets():
                log(f"unmount {self.target}")
                unmount(str(self.target))
        finally:
            os.close(mutex)


def unmount(target: str) -> None:
    """Unmount ``target``, detaching it when still busy (a dead mount, a process on its way out)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(target.encode(), 0) != 0:
        # still busy (a process is leaving): detach it, the kernel finishes later
        libc.umount2(target.encode(), 2)  # MNT_DETACH


def mounts_dir(unpack_dir: str, state_dir: Path) -> Path:
    """Where this namespace's squashfuse mounts and their references live.

    A squashfuse mount is made in podman's mount namespace, which every storage
    (graph root) of the user on the node shares: counting per graph root would
    let one storage unmount what another's container is about to use. So: one
    directory per mount namespace, with the unpacked copies (node-local, the
    user's own whatever the site's template: ``readpath.node_state_dir``).
    """
    if not unpack_dir:
        return state_dir
    namespace = os.stat("/proc/self/ns/mnt").st_ino
    return own_dir(own_dir(own_dir(node_state_dir(unpack_dir)) / MOUNTS_DIR) / str(namespace))
