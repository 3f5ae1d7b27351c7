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

A copy is RAM (tmpfs, charged to the memory cgroup of the job that wrote it,
and kept after that job), so the cache has a policy (``sweep``):
``squash_unpack_max_mb`` may be a share of the node's memory (``"10%"``, the
default: of MemTotal, or of this process's memory cgroup limit where that is
lower, as in a Slurm job on a shared node; ``squash_unpack_login_max_mb``,
2048 MiB, on a login node); an unused copy whose last use is
older than ``squash_unpack_idle_minutes`` (30) is removed, and so is an
unused one made by a Slurm job that has ended, at the next mount-program call
or ``infohpc`` of its user on the node (no daemon: nothing runs between
them). On a login node (no ``SLURM_JOB_ID``) ``auto`` does not unpack: there
hundreds of users share the RAM, charged to no job, while squashfuse's pages
are page cache the kernel can reclaim.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import socket
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from . import commands
from .locks import flocked
from .private import own_dir

MODES = ("auto", "unpacked", "kernel", "fuse")
# A tenth of the node's (or the job's) memory: room for the large ML images (15-20 GB
# unpacked) on a 256 GB GPU node, and 90% left to the job whose cgroup pays for it.
DEFAULT_BUDGET = "10%"
DEFAULT_IDLE_MINUTES = 30.0
# On a login node (hundreds of users, RAM charged to no job) unpacking is asked for
# (``squash_read_path: unpacked``) and then bounded per user: a Python/Jupyter image or two.
DEFAULT_LOGIN_BUDGET = "2048"
# An unpacked image takes about this many times its squash file (lz4 packs
# a Debian root about 2x); a copy is only started with this much room.
UNPACK_ESTIMATE = 3
# An unpack that failed with less room than this left in the cache failed for want of room.
FULL_BELOW = 2**20
# Mount options podman (containers/storage) gives its mount program that kernel
# overlayfs takes as they are; any other option (uidmapping=, ...) is fuse-overlayfs's.
KERNEL_OPTIONS = ("lowerdir=", "upperdir=", "workdir=", "volatile")


@dataclass(frozen=True)
class ReadPathSettings:
    """The read-path keys of the site configuration, as the mount program sees them."""

    mode: str = "auto"
    unpack_dir: str = ""
    unpack_max_mb: float = 4096.0  # resolved: MiB on this node
    idle_minutes: float = DEFAULT_IDLE_MINUTES
    # the Slurm job podman runs in; "" on a login node, None when not told (an older
    # podman-hpc, a direct call): then auto unpacks as before
    job: str | None = None

    VARIABLES = {"mode": "PODMANHPC_SQUASH_READ_PATH", "unpack_dir": "PODMANHPC_SQUASH_UNPACK_DIR",
                 "unpack_max_mb": "PODMANHPC_SQUASH_UNPACK_MAX_MB",
                 "idle_minutes": "PODMANHPC_SQUASH_UNPACK_IDLE_MINUTES", "job": "PODMANHPC_SQUASH_JOB"}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ReadPathSettings":
        env = os.environ if env is None else env
        mode = env.get(cls.VARIABLES["mode"], "auto")
        try:
            budget = budget_mb(env.get(cls.VARIABLES["unpack_max_mb"], str(cls.unpack_max_mb)))
        except ValueError:
            budget = cls.unpack_max_mb
        try:
            idle = float(env.get(cls.VARIABLES["idle_minutes"], DEFAULT_IDLE_MINUTES))
        except ValueError:
            idle = DEFAULT_IDLE_MINUTES
        return cls(mode=mode if mode in MODES else "auto",
                   unpack_dir=env.get(cls.VARIABLES["unpack_dir"], ""), unpack_max_mb=budget,
                   idle_minutes=idle, job=env.get(cls.VARIABLES["job"]))

    def env(self) -> dict[str, str]:
        env = {self.VARIABLES["mode"]: self.mode, self.VARIABLES["unpack_dir"]: self.unpack_dir,
               self.VARIABLES["unpack_max_mb"]: f"{self.unpack_max_mb:g}",
               self.VARIABLES["idle_minutes"]: f"{self.idle_minutes:g}"}
        if self.job is not None:
            env[self.VARIABLES["job"]] = self.job
        return env

    @property
    def login_node(self) -> bool:
        return self.job == ""

    @property
    def unpacks(self) -> bool:
        wanted = self.mode == "unpacked" or (self.mode == "auto" and not self.login_node)
        return wanted and bool(self.unpack_dir)

    @property
    def kernel_overlay(self) -> bool:
        return self.mode != "fuse"


def budget_mb(value: str | float, memory: int | None = None) -> float:
    """``squash_unpack_max_mb`` in MiB: a number of MiB, or ``"N%"`` of ``memory``
    (default: this node's, ``memory_bytes``). ValueError if it is neither, or not positive."""
    text = str(value).strip()
    if text.endswith("%"):
        share = float(text[:-1])
        if not 0 < share <= 100:
            raise ValueError(f"{text} is not a share of memory between 0 and 100%")
        return round((memory_bytes() if memory is None else memory) * share / 100 / 2**20, 1)
    number = float(text)
    if number <= 0:
        raise ValueError(f"{text} is not a positive number of MiB")
    return number


def budget_key(settings: ReadPathSettings) -> str:
    """The configuration key the budget came from, for messages."""
    return "squash_unpack_login_max_mb" if settings.login_node else "squash_unpack_max_mb"


def memory_bytes() -> int:
    """The memory a copy made by this process is charged against: the node's MemTotal, or
    the limit of our memory cgroup (or an ancestor's) where lower, e.g. a Slurm job's."""
    total = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    limits = [limit for limit in cgroup_limits() if limit > 0]
    return min([total, *limits]) if total else min(limits, default=0)


def cgroup_limits(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> list[int]:
    """Memory limits of our cgroup and its ancestors (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return []
    limits = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        here = base / path.lstrip("/")
        while True:
            try:
                limits.append(int((here / name).read_text().strip()))
            except (OSError, ValueError):  # "max", unreadable, or above our cgroup namespace
                pass
            if here == base or base not in here.parents:
                break
            here = here.parent
    return limits


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

    def __init__(self, squash: Path, cache_dir: Path, max_bytes: int, source_fd: int | None = None,
                 settings: ReadPathSettings | None = None):
        self.squash = squash
        self.cache = cache_dir
        self.max_bytes = max_bytes
        # idle time and job for the cache's policy (``sweep``): podman's environment's by default
        settings = ReadPathSettings.from_env() if settings is None else settings
        self.settings = replace(settings, unpack_max_mb=max_bytes / 2**20)  # one budget
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
        self.removed: list[tuple[str, str]] = []  # (key, why) of the copies acquire() removed

    def acquire(self) -> Path:
        """The unpacked tree, made if needed; NoRoom if the node cannot hold it."""
        if self.estimate > self.max_bytes:
            raise NoRoom(f"{self.squash.name} would take about {self.estimate >> 20} MiB unpacked, "
                         f"more than {budget_key(self.settings)} ({self.max_bytes >> 20} MiB)")
        own_dir(self.cache)  # made, and its parents judged, by the podman-hpc that started podman
        with flocked(self.cache / ".lock", 0o600):
            self.ref_fd = os.open(self.ref_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.ref_fd, fcntl.LOCK_SH)
            try:
                self.removed = sweep(self.cache, self.settings, keep={self.key})
                if not self.root.is_dir():
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
        source, fds = str(self.squash), ()
        if self.source_fd is not None:
            source, fds = f"/proc/self/fd/{self.source_fd}", (self.source_fd,)
        result = commands.run([unsquashfs, "-no-progress", "-quiet", "-dest", str(staging), source],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=fds)
        if result.returncode != 0:
            free = shutil.disk_usage(self.cache).free
            shutil.rmtree(staging, ignore_errors=True)
            if free < FULL_BELOW:
                raise NoRoom(f"the unpack cache {self.cache} is full (ENOSPC, {free >> 20} MiB free) "
                             f"while unpacking {self.squash.name}")
            raise NoRoom(f"unsquashfs of {self.squash.name} failed: "
                         f"{(result.stderr.strip().splitlines() or ['?'])[-1]}")
        os.chmod(staging, 0o755)
        os.rename(staging, self.root)
        self._write_ref(tree_bytes(self.root))

    def _write_ref(self, size: int) -> None:
        """The ref file: the tree's size on its first line (``cache_entries``), then who made it."""
        meta = {"squash": str(self.squash), "job": self.settings.job or "",
                "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname()}
        os.ftruncate(self.ref_fd, 0)
        os.pwrite(self.ref_fd, f"{size}\n{json.dumps(meta)}\n".encode(), 0)

    def _make_room(self) -> None:
        free = shutil.disk_usage(self.cache).free
        entries = cache_entries(self.cache)
        used = sum(size for _, size, _ in entries)
        unused = sorted((e for e in entries if e[0] != self.key and not in_use(self.cache, e[0])),
                        key=lambda e: e[2])
        while unused and (used + self.estimate > self.max_bytes or free < self.estimate):
            key, size, _ = unused.pop(0)
            evict(self.cache, key)
            self.removed.append((key, f"room for {self.squash.name} ({used >> 20} MiB used, {free >> 20} MiB free)"))
            used -= size
            free += size
        if used + self.estimate > self.max_bytes or free < self.estimate:
            raise NoRoom(f"no room for {self.squash.name} in {self.cache} "
                         f"({free >> 20} MiB free, {used >> 20} MiB in use by other images)")


def cache_entries(cache: Path) -> list[tuple[str, int, float]]:
    """(key, bytes, last use) of every copy in the cache."""
    return [(key, size, last) for key, size, last, _ in _refs(cache)]


def _refs(cache: Path) -> list[tuple[str, int, float, dict]]:
    """(key, bytes, last use, who made it) of every copy, each ref file read once."""
    entries = []
    for ref in cache.glob("*.ref"):
        try:
            text, last = ref.read_text(), ref.stat().st_mtime
            entries.append((ref.stem, int(text.partition("\n")[0] or 0), last, _meta(text)))
        except (OSError, ValueError):
            continue
    return entries


def size_of(ref: Path) -> int:
    return int(ref.read_text().partition("\n")[0] or 0)


def read_meta(ref: Path) -> dict:
    """What the ref file says of its copy (squash file, job, node); {} for a copy made before."""
    try:
        return _meta(ref.read_text())
    except OSError:
        return {}


def _meta(text: str) -> dict:
    try:
        meta = json.loads(text.partition("\n")[2] or "{}")
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class CachedCopy:
    """One unpacked copy, as ``infohpc`` shows it."""

    key: str
    bytes: int
    last_use: float
    in_use: bool
    squash: str = ""
    job: str = ""
    node: str = ""


def copies(cache: Path) -> list[CachedCopy]:
    """Every copy in the cache, least recently used first."""
    found = [CachedCopy(key, size, last, in_use(cache, key),
                        **{k: str(v) for k, v in meta.items() if k in ("squash", "job", "node")})
             for key, size, last, meta in _refs(cache)]
    return sorted(found, key=lambda c: c.last_use)


def sweep(cache: Path, settings: ReadPathSettings, keep: set[str] = frozenset(), now: float | None = None,
          ended=None, release_job: bool = False) -> list[tuple[str, str]]:
    """Remove the unused copies idle past ``settings.idle_minutes`` or made by a Slurm job that
    has ended (``ended(job)``, default: asks Slurm), then the least recently used unused ones
    while the copies take more than the budget; (key, why) of each. Call under the cache lock.
    A copy in use, or in ``keep``, stays. ``release_job``: this job is ending (its last step),
    its own unused copies go too."""
    now = time.time() if now is None else now
    ended = job_ended if ended is None else ended
    answers: dict[str, bool] = {}
    removed = []
    found = copies(cache)
    over = sum(copy.bytes for copy in found) - settings.unpack_max_mb * 2**20
    for copy in found:
        if copy.key in keep or copy.in_use:
            continue
        why = ""
        if now - copy.last_use > settings.idle_minutes * 60:
            why = (f"unused for {(now - copy.last_use) / 60:.1f} min, more than squash_unpack_idle_minutes "
                   f"({settings.idle_minutes:g})")
        elif release_job and copy.job and copy.job == settings.job:
            why = f"released at the end of job {copy.job}"
        elif copy.job and copy.job != settings.job:
            if copy.job not in answers:
                answers[copy.job] = ended(copy.job)
            if answers[copy.job]:
                why = f"made by job {copy.job}, which has ended"
        if not why and over > 0:  # oldest first: ``copies`` is in order of last use
            why = f"over {budget_key(settings)} ({settings.unpack_max_mb:g} MiB)"
        if why:
            evict(cache, copy.key)
            removed.append((copy.key, why))
            over -= copy.bytes
    return removed


def sweep_cache(settings: ReadPathSettings, release_job: bool = False) -> list[tuple[str, str]]:
    """``sweep`` the user's cache on this node under its lock (from the mount program or
    ``infohpc``, inside podman's user namespace, where the trees' files can be removed)."""
    cache = Path(settings.unpack_dir) if settings.unpack_dir else None
    if cache is None or not any(cache.glob("*.ref")):
        return []
    own_dir(cache)
    with flocked(cache / ".lock", 0o600):
        return sweep(cache, settings, release_job=release_job)


def sweep_unused(settings: ReadPathSettings) -> None:
    """The mount program's sweep where it will not unpack (an unpack sweeps under its own
    lock): a login node's or a ``kernel``/``fuse`` node's old copies go too. Never fails a mount."""
    if settings.unpacks:
        return
    try:
        sweep_cache(settings)
    except Exception:  # noqa: BLE001 - an unsafe or unreadable cache: infohpc says so, the mount goes on
        pass


def job_ended(job: str) -> bool:
    """True once Slurm no longer lists ``job`` as pending, running or completing; False while it
    does, and whenever Slurm cannot say (then the idle time applies)."""
    squeue = shutil.which("squeue")
    if not squeue or not job.isdigit():
        return False
    try:
        result = commands.run([squeue, "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if result.returncode != 0:
        return "Invalid job id" in result.stderr
    return result.stdout.strip() == ""  # squeue lists a job until it has completed


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


def sweep_report(settings: ReadPathSettings, release_job: bool = False) -> dict:
    """``sweep_cache``, then the copies that remain (``infohpc``'s JSON)."""
    removed = sweep_cache(settings, release_job)
    cache = Path(settings.unpack_dir)
    remaining = copies(cache) if settings.unpack_dir and cache.is_dir() else []
    return {"removed": removed, "copies": [copy.__dict__ for copy in remaining]}


if __name__ == "__main__":  # podman-hpc infohpc runs this inside podman's user namespace
    import sys
    import tempfile

    if sys.argv[1:2] == ["sweep"]:
        print(json.dumps(sweep_report(ReadPathSettings.from_env(), release_job=sys.argv[2:] == ["--release-job"])))
        sys.exit(0)
    with tempfile.TemporaryDirectory(prefix="overlay-probe-", dir=sys.argv[1]) as scratch:
        reason = probe_kernel_overlay(Path(scratch))
    print(reason)
    sys.exit(1 if reason else 0)
