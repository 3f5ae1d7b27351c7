"""One squash file unpacked into the node-local cache (``engine/mount/cache.py``), made under
the cache's lock with room made for it, and held by its containers for as long as they run."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

from ..base import commands
from ..base.locks import flocked
from ..base.private import own_dir
from ..base.space import free_bytes, looks_full
from ..site.readpath import ReadPathSettings, budget_key
from .cache import cache_entries, evict, in_use, read_meta, size_of, sweep, write_ref

# An unpacked image takes about this many times its squash file (lz4 packs
# a Debian root about 2x); a copy is only started with this much room.
UNPACK_ESTIMATE = 3


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

    def __init__(
        self,
        squash: Path,
        cache_dir: Path,
        max_bytes: int,
        source_fd: int | None = None,
        settings: ReadPathSettings | None = None,
    ):
        self.squash = squash
        self.cache = cache_dir
        self.max_bytes = max_bytes
        # idle time and job for the cache's policy (``sweep``): podman's environment's by default
        settings = ReadPathSettings.from_env() if settings is None else settings
        self.settings = replace(settings, unpack_max_mb=max_bytes / 2**20)  # one budget
        # the file the mount program checked against its record (engine/store/squashcheck.py), by descriptor:
        # unsquashfs reads that file even if the name was replaced since
        self.source_fd = source_fd
        st = squash.stat() if source_fd is None else os.fstat(source_fd)
        ident = f"{os.path.realpath(squash)}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
        self.key = hashlib.sha256(ident.encode()).hexdigest()[:32]
        self.root = cache_dir / self.key
        self.ref_path = cache_dir / f"{self.key}.ref"
        self.ref_fd: int | None = None
        self.estimate = st.st_size * UNPACK_ESTIMATE
        self.removed: list[tuple[str, str]] = []  # (key, why) of the copies acquire() removed
        self.lost = (
            False  # acquire() found this copy's tree gone (removed outside the cache's policy) and made it again
        )

    def acquire(self) -> Path:
        """The unpacked tree, made if needed; NoRoom if the node cannot hold it."""
        if self.estimate > self.max_bytes:
            raise NoRoom(
                f"{self.squash.name} would take about {self.estimate >> 20} MiB unpacked, "
                f"more than {budget_key(self.settings)} ({self.max_bytes >> 20} MiB)"
            )
        own_dir(self.cache)  # made, and its parents judged, by the podman-hpc that started podman
        with flocked(self.cache / ".lock", 0o600):
            self.ref_fd = os.open(self.ref_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.ref_fd, fcntl.LOCK_SH)
            try:
                self.removed = sweep(self.cache, self.settings, keep={self.key})
                if not self.root.is_dir():
                    self.lost = size_of(self.ref_path) > 0  # its ref says it was made
                    self._make()
                elif read_meta(self.ref_path).get("job") != (self.settings.job or ""):
                    self._write_ref(size_of(self.ref_path))  # now this job's: its end releases it
                os.utime(self.ref_path)  # last use, for eviction
            except BaseException:
                self.release()
                if not self.root.is_dir():  # nothing was made: no empty ref left for the sweep (we hold the lock)
                    self.ref_path.unlink(missing_ok=True)
                raise
        return self.root

    def release(self) -> None:
        """Drop this container's hold on the copy; its idle time counts from now."""
        if self.ref_fd is not None:
            try:
                os.utime(self.ref_path)  # the idle time counts from the last container's end
            except OSError:
                pass
            os.close(self.ref_fd)
            self.ref_fd = None

    def _make(self) -> None:
        for stale in self.cache.glob("*.tmp-*"):  # a killed unpack's (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        self._make_room()
        staging = self.cache / f"{self.key}.tmp-{os.getpid()}"
        unsquashfs = shutil.which("unsquashfs") or "/usr/bin/unsquashfs"
        source = str(self.squash)
        fds: tuple[int, ...] = ()
        if self.source_fd is not None:
            source, fds = f"/proc/self/fd/{self.source_fd}", (self.source_fd,)
        result = commands.run(
            [unsquashfs, "-no-progress", "-quiet", "-dest", str(staging), source],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=fds,
        )
        if result.returncode != 0:
            full, free = looks_full(self.cache), free_bytes(self.cache) or 0
            shutil.rmtree(staging, ignore_errors=True)
            if full:
                raise NoRoom(
                    f"the unpack cache {self.cache} is full (ENOSPC, {free >> 20} MiB free) "
                    f"while unpacking {self.squash.name}"
                )
            raise NoRoom(
                f"unsquashfs of {self.squash.name} failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}"
            )
        os.chmod(staging, 0o755)
        os.rename(staging, self.root)
        self._write_ref(tree_bytes(self.root))

    def _write_ref(self, size: int) -> None:
        assert self.ref_fd is not None  # written only under acquire(), which holds the ref file open
        write_ref(
            self.ref_fd,
            size,
            {
                "squash": str(self.squash),
                "job": self.settings.job or "",
                "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            },
        )

    def _make_room(self) -> None:
        free = shutil.disk_usage(self.cache).free
        entries = cache_entries(self.cache)
        used = sum(size for _, size, _ in entries)
        unused = sorted((e for e in entries if e[0] != self.key and not in_use(self.cache, e[0])), key=lambda e: e[2])
        while unused and (used + self.estimate > self.max_bytes or free < self.estimate):
            key, size, _ = unused.pop(0)
            evict(self.cache, key)
            self.removed.append((key, f"room for {self.squash.name} ({used >> 20} MiB used, {free >> 20} MiB free)"))
            used -= size
            free += size
        if used + self.estimate > self.max_bytes or free < self.estimate:
            raise NoRoom(
                f"no room for {self.squash.name} in {self.cache} "
                f"({free >> 20} MiB free, {used >> 20} MiB in use by other images)"
            )


def tree_bytes(root: Path) -> int:
    """The bytes the files below ``root`` take on disk (tmpfs: in memory)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return total
