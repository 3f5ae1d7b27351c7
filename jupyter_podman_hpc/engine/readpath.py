"""How a squashed image's files reach its containers on a node (the read path).

``squash_read_path`` in podman_hpc.yaml chooses; ``bench/readpath.py`` holds the
measurements behind the choice:

- ``unpacked``: each squash file is unpacked once per node into
  ``squash_unpack_dir`` (node-local tmpfs by default), shared by every
  container of the user there, below kernel overlayfs. Reads cost what bare
  metal's cost.
- ``kernel``: the squash file mounted with squashfuse_ll, below kernel
  overlayfs.
- ``fuse``: squashfuse_ll below fuse-overlayfs, podman-hpc 1.2.2's path.
- ``auto`` (the default): ``unpacked`` while the image fits the cache budget
  and the directory has room, else ``kernel`` where the node allows an
  overlay mount in the user namespace, else ``fuse``.

The mount program (``engine/mount.py``) runs inside podman's user namespace
and reads the choice from the ``PODMANHPC_SQUASH_*`` variables that
``SiteConfig.podman_env`` gives podman. Unpacked copies are a node-local
cache, as podman's own graph root is: kept after their last container so
that the next step starts at once, bounded by ``squash_unpack_max_mb`` (the
least recently used unused copy goes first).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from . import commands
from .locks import flocked
from .private import own_dir

MODES = ("auto", "unpacked", "kernel", "fuse")
# An unpacked image takes about this many times its squash file (lz4 packs
# a Debian root about 2x); a copy is only started with this much room.
UNPACK_ESTIMATE = 3
# Mount options podman (containers/storage) gives its mount program that kernel
# overlayfs takes as they are; any other option (uidmapping=, ...) is fuse-overlayfs's.
KERNEL_OPTIONS = ("lowerdir=", "upperdir=", "workdir=", "volatile")


@dataclass(frozen=True)
class ReadPathSettings:
    """The read-path keys of the site configuration, as the mount program sees them."""

    mode: str = "auto"
    unpack_dir: str = ""
    unpack_max_mb: float = 4096.0

    VARIABLES = {"mode": "PODMANHPC_SQUASH_READ_PATH", "unpack_dir": "PODMANHPC_SQUASH_UNPACK_DIR",
                 "unpack_max_mb": "PODMANHPC_SQUASH_UNPACK_MAX_MB"}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ReadPathSettings":
        env = os.environ if env is None else env
        mode = env.get(cls.VARIABLES["mode"], "auto")
        try:
            budget = float(env.get(cls.VARIABLES["unpack_max_mb"], cls.unpack_max_mb))
        except ValueError:
            budget = cls.unpack_max_mb
        return cls(mode=mode if mode in MODES else "auto",
                   unpack_dir=env.get(cls.VARIABLES["unpack_dir"], ""), unpack_max_mb=budget)

    def env(self) -> dict[str, str]:
        return {self.VARIABLES["mode"]: self.mode, self.VARIABLES["unpack_dir"]: self.unpack_dir,
                self.VARIABLES["unpack_max_mb"]: f"{self.unpack_max_mb:g}"}

    @property
    def unpacks(self) -> bool:
        return self.mode in ("auto", "unpacked") and bool(self.unpack_dir)

    @property
    def kernel_overlay(self) -> bool:
        return self.mode != "fuse"


class NoRoom(Exception):
    """The node cannot hold an unpacked copy of this image: the caller falls back."""


class UnpackedCopy:
    """A squash file unpacked into the node-local cache, held by reference.

    ``<cache>/<key>/`` is the tree, ``<cache>/<key>.ref`` records its size and
    last use; users hold a shared flock on the ref file for as long as their
    overlay exists. Unpacking and eviction happen under ``<cache>/.lock``, so
    a copy is never seen half-made, and a tree left by a killed unpack
    (``<key>.tmp-*``) is removed by the next one.
    """

    def __init__(self, squash: Path, cache_dir: Path, max_bytes: int, source_fd: int | None = None):
        self.squash = squash
        self.cache = cache_dir
        self.max_bytes = max_bytes
        # the file the mount program checked against its record (engine/squashcheck.py), by descriptor:
        # unsquashfs reads that file even if the name was replaced since
        self.source_fd = source_fd
        st = squash.stat() if source_fd is None else os.fstat(source_fd)
        ident = f"{os.path.realpath(squash)}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
        self.key = hashlib.sha256(ident.encode()).hexdigest()[:32]
        self.root = cache_dir / self.key
        self.ref_path = cache_dir / f"{self.key}.ref"
        self.ref_fd: int | None = None
        self.estimate = st.st_size * UNPACK_ESTIMATE

    def acquire(self) -> Path:
        """The unpacked tree, made if needed; NoRoom if the node cannot hold it."""
        if self.estimate > self.max_bytes:
            raise NoRoom(f"{self.squash.name} would take about {self.estimate >> 20} MiB unpacked, "
                         f"more than squash_unpack_max_mb ({self.max_bytes >> 20} MiB)")
        own_dir(self.cache)  # made, and its parents judged, by the podman-hpc that started podman
        with flocked(self.cache / ".lock", 0o600):
            self.ref_fd = os.open(self.ref_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.ref_fd, fcntl.LOCK_SH)
            try:
                if not self.root.is_dir():
                    self._make()
                os.utime(self.ref_path)  # last use, for eviction
            except BaseException:
                self.release()
                raise
        return self.root

    def release(self) -> None:
        if self.ref_fd is not None:
            os.close(self.ref_fd)
            self.ref_fd = None

    def _make(self) -> None:
        for stale in self.cache.glob("*.tmp-*"):  # a killed unpack's (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        self._make_room()
        staging = self.cache / f"{self.key}.tmp-{os.getpid()}"
        unsquashfs = shutil.which("unsquashfs") or "/usr/bin/unsquashfs"
        source, fds = str(self.squash), ()
        if self.source_fd is not None:
            source, fds = f"/proc/self/fd/{self.source_fd}", (self.source_fd,)
        result = commands.run([unsquashfs, "-no-progress", "-quiet", "-dest", str(staging), source],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=fds)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise NoRoom(f"unsquashfs of {self.squash.name} failed: "
                         f"{(result.stderr.strip().splitlines() or ['?'])[-1]}")
        os.chmod(staging, 0o755)
        os.rename(staging, self.root)
        os.pwrite(self.ref_fd, str(tree_bytes(self.root)).encode(), 0)

    def _make_room(self) -> None:
        free = shutil.disk_usage(self.cache).free
        entries = cache_entries(self.cache)
        used = sum(size for _, size, _ in entries)
        unused = sorted((e for e in entries if e[0] != self.key and not in_use(self.cache, e[0])),
                        key=lambda e: e[2])
        while unused and (used + self.estimate > self.max_bytes or free < self.estimate):
            key, size, _ = unused.pop(0)
            evict(self.cache, key)
            used -= size
            free += size
        if used + self.estimate > self.max_bytes or free < self.estimate:
            raise NoRoom(f"no room for {self.squash.name} in {self.cache} "
                         f"({free >> 20} MiB free, {used >> 20} MiB in use by other images)")


def cache_entries(cache: Path) -> list[tuple[str, int, float]]:
    """(key, bytes, last use) of every copy in the cache."""
    entries = []
    for ref in cache.glob("*.ref"):
        try:
            size = int(ref.read_text() or 0)
            entries.append((ref.stem, size, ref.stat().st_mtime))
        except (OSError, ValueError):
            continue
    return entries


def in_use(cache: Path, key: str) -> bool:
    """True while a container holds the copy (its ref lock), or an overlay of ours lists it."""
    try:
        fd = os.open(cache / f"{key}.ref", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    # a watcher killed with SIGKILL drops its lock, but the overlay may still be up
    needle = str(cache / key)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(needle in line for line in mountinfo)


def evict(cache: Path, key: str) -> None:
    shutil.rmtree(cache / key, ignore_errors=True)
    (cache / f"{key}.ref").unlink(missing_ok=True)


def tree_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return total


# --- kernel overlayfs -----------------------------------------------------------------


def kernel_options(options: Sequence[str], lowers: Sequence[str]) -> str | None:
    """The kernel overlayfs option string for podman's mount options, or None if one needs fuse-overlayfs."""
    items = [item for option in options for item in option.split(",") if item]
    if any(not item.startswith(KERNEL_OPTIONS) for item in items):
        return None
    kept = [item for item in items if not item.startswith("lowerdir=")]
    return ",".join([f"lowerdir={':'.join(lowers)}", *kept, "userxattr"])


def mount_overlay(target: str, options: str) -> None:
    """mount(2) a kernel overlayfs; OSError if this node or namespace does not allow it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"overlay", target.encode(), b"overlay", 0, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def note_fallback(state_dir: Path, message: str) -> None:
    """Record why this node fell back, once per distinct reason (``infohpc`` shows them)."""
    log = state_dir / "read-path.log"
    try:
        if log.exists() and message in log.read_text():
            return
        with open(log, "a") as out:
            out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
    except OSError:
        pass


def fallbacks(state_dir: Path) -> list[str]:
    try:
        return (state_dir / "read-path.log").read_text().splitlines()
    except OSError:
        return []


def probe_kernel_overlay(scratch: Path) -> str:
    """'' if a kernel overlay mounts here (run inside podman's user namespace), else why not."""
    dirs = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    options = (f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']},userxattr")
    try:
        mount_overlay(str(dirs["merged"]), options)
    except OSError as err:
        return err.strerror or errno.errorcode.get(err.errno, "?")
    ctypes.CDLL(None, use_errno=True).umount2(str(dirs["merged"]).encode(), 2)
    return ""


if __name__ == "__main__":  # podman-hpc infohpc runs this inside podman's user namespace
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="overlay-probe-", dir=sys.argv[1]) as scratch:
        reason = probe_kernel_overlay(Path(scratch))
    print(reason)
    sys.exit(1 if reason else 0)
