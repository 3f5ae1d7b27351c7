"""How a squashed image's files reach its containers on a node (the read path): the choice,
the settings the mount program reads, the unpack cache's budget, and the log of fallbacks.

``squash_read_path`` in podman_hpc.yaml chooses; ``bench/readpath.py`` holds the
measurements behind the choice:

- ``unpacked``: each squash file is unpacked once per node into
  ``squash_unpack_dir`` (node-local tmpfs by default; ``engine/mount/unpack.py``), shared
  by every container of the user there, below kernel overlayfs. Reads cost what
  bare metal's cost.
- ``kernel``: the squash file mounted with squashfuse_ll, below kernel
  overlayfs (``engine/mount/kerneloverlay.py``).
- ``fuse``: squashfuse_ll below fuse-overlayfs, podman-hpc 1.2.2's path.
- ``auto`` (the default): ``unpacked`` while the image fits the cache budget,
  the directory has room and the job's nodes together read at most
  ``squash_unpack_auto_job_max_mb`` from the shared store to unpack it (each
  node reads the whole squash file; ``bench/scale.py`` measures it, and
  ``bench/README.md`` has the model), else ``kernel`` where the node allows an
  overlay mount in the user namespace, else ``fuse``.

The mount program (``engine/mount/program.py``) runs inside podman's user namespace
and reads the choice from the ``PODMANHPC_SQUASH_*`` variables that
``SiteConfig.podman_env`` gives podman (``ReadPathSettings``).

Unpacked copies are RAM, so the cache (``engine/mount/cache.py``) has a budget:
``squash_unpack_max_mb`` may be a share of the node's memory (``"10%"``, the
default: of MemTotal, or of this process's memory cgroup limit where that is
lower, as in a Slurm job on a shared node; ``squash_unpack_login_max_mb``,
2048 MiB, on a login node). On a login node (no ``SLURM_JOB_ID``) ``auto`` does
not unpack: there hundreds of users share the RAM, charged to no job, while
squashfuse's pages are page cache the kernel can reclaim.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

MODES = ("auto", "unpacked", "kernel", "fuse")
# A tenth of the node's (or the job's) memory: room for the large ML images (15-20 GB
# unpacked) on a 256 GB GPU node, and 90% left to the job whose cgroup pays for it.
DEFAULT_BUDGET = "10%"
DEFAULT_IDLE_MINUTES = 30.0
# On a login node (hundreds of users, RAM charged to no job) unpacking is asked for
# (``squash_read_path: unpacked``) and then bounded per user: a Python/Jupyter image or two.
DEFAULT_LOGIN_BUDGET = "2048"
# What ``auto`` lets a job's nodes read together from the shared store to unpack an image: nodes x
# squash file size (bench/README.md, "the scale model").
DEFAULT_AUTO_JOB_MAX_MB = 65536.0


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
    job_nodes: int = 0  # the job's node count; 0 when unknown
    auto_job_max_mb: float = DEFAULT_AUTO_JOB_MAX_MB

    VARIABLES: ClassVar[dict[str, str]] = {
        "mode": "PODMANHPC_SQUASH_READ_PATH",
        "unpack_dir": "PODMANHPC_SQUASH_UNPACK_DIR",
        "unpack_max_mb": "PODMANHPC_SQUASH_UNPACK_MAX_MB",
        "idle_minutes": "PODMANHPC_SQUASH_UNPACK_IDLE_MINUTES",
        "job": "PODMANHPC_SQUASH_JOB",
        "job_nodes": "PODMANHPC_SQUASH_JOB_NODES",
        "auto_job_max_mb": "PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB",
    }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReadPathSettings:
        """The settings in ``env`` (the process environment by default), as ``env()`` wrote them; a value
        that does not parse falls back to its default, an unknown mode to ``auto``."""
        env = os.environ if env is None else env
        mode = env.get(cls.VARIABLES["mode"], "auto")
        try:
            budget = budget_mb(env.get(cls.VARIABLES["unpack_max_mb"], str(cls.unpack_max_mb)))
        except ValueError:
            budget = cls.unpack_max_mb
        return cls(
            mode=mode if mode in MODES else "auto",
            unpack_dir=env.get(cls.VARIABLES["unpack_dir"], ""),
            unpack_max_mb=budget,
            idle_minutes=_number(env, cls.VARIABLES["idle_minutes"], DEFAULT_IDLE_MINUTES),
            job=env.get(cls.VARIABLES["job"]),
            job_nodes=int(_number(env, cls.VARIABLES["job_nodes"], 0)),
            auto_job_max_mb=_number(env, cls.VARIABLES["auto_job_max_mb"], DEFAULT_AUTO_JOB_MAX_MB),
        )

    def env(self) -> dict[str, str]:
        """The environment variables that hand these settings to the mount program (``from_env`` reads them
        back)."""
        env = {
            self.VARIABLES["mode"]: self.mode,
            self.VARIABLES["unpack_dir"]: self.unpack_dir,
            self.VARIABLES["unpack_max_mb"]: f"{self.unpack_max_mb:g}",
            self.VARIABLES["idle_minutes"]: f"{self.idle_minutes:g}",
            self.VARIABLES["job_nodes"]: str(self.job_nodes),
            self.VARIABLES["auto_job_max_mb"]: f"{self.auto_job_max_mb:g}",
        }
        if self.job is not None:
            env[self.VARIABLES["job"]] = self.job
        return env

    @property
    def login_node(self) -> bool:
        """Known to be outside any Slurm job (``job`` is "", not unknown): the login node's budget applies
        and ``auto`` mode unpacks nothing."""
        return self.job == ""

    @property
    def unpacks(self) -> bool:
        """Squashed images are read from unpacked copies here: mode ``unpacked``, or ``auto`` inside a job,
        and an unpack directory set."""
        wanted = self.mode == "unpacked" or (self.mode == "auto" and not self.login_node)
        return wanted and bool(self.unpack_dir)

    def auto_declines(self, squash_bytes: int) -> str:
        """Why ``auto`` reads a squash file of ``squash_bytes`` through squashfuse though it would unpack it:
        every node of the job unpacks the whole file, and together they would read more than
        ``squash_unpack_auto_job_max_mb`` from the shared store. "" when that is no reason."""
        total = self.job_nodes * squash_bytes / 2**20
        if self.mode != "auto" or total <= self.auto_job_max_mb:
            return ""
        return (
            f"auto reads it through squashfuse: {self.job_nodes} nodes x {squash_bytes / 2**20:.0f} MiB "
            f"would read {total:.0f} MiB from the shared store, more than squash_unpack_auto_job_max_mb "
            f"({self.auto_job_max_mb:g})"
        )

    @property
    def kernel_overlay(self) -> bool:
        """Layers are mounted with the kernel's squashfs and overlay (every mode but ``fuse``)."""
        return self.mode != "fuse"


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    """A number from ``env``; ``default`` when absent or not a number."""
    try:
        return float(env.get(name, default))
    except ValueError:
        return default


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
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
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


def node_state_dir(unpack_dir: str | os.PathLike) -> Path:
    """Where the user's node-local state beside the unpacked copies lives (the checked squash files,
    the squashfuse mounts): beside the unpack directory when its parent is the user's own and nobody
    else may write it (the default ``/dev/shm/<uid>_hpc``), else in the unpack directory itself, the
    user's own whatever its template (``/dev/shm/unpacked-{{ uid }}`` has everyone's ``/dev/shm`` as
    its parent). In podman's user namespace the user is root, and so are the user's files."""
    unpack = Path(unpack_dir)
    try:
        st = os.lstat(unpack.parent)
    except OSError:
        return unpack
    own = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return unpack.parent if own else unpack


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
    """The lines ``note_fallback`` wrote in ``state_dir`` (why this node fell back, dated); empty when none."""
    try:
        return (state_dir / "read-path.log").read_text().splitlines()
    except OSError:
        return []
